"""patches/0003 (start_from_position): applied in the installed petals, reversible to pristine, re-appliable."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import petals
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIFF = ROOT / "patches" / "0003-petals-rollback-start-from-position.diff"


def _applier():
    """patches/apply.py as a module."""
    spec = importlib.util.spec_from_file_location("patch_apply_0003", ROOT / "patches" / "apply.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def site_copy(tmp_path: Path) -> Path:
    """A copy of the installed (patched) petals server package under a fake site-packages."""
    shutil.copytree(Path(petals.__file__).parent / "server", tmp_path / "petals" / "server",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_installed_server_reads_start_from_position(site_copy: Path) -> None:
    """The venv's petals has 0003: re-applying is a no-op, and the field is read before each step's tensors."""
    ap = _applier()
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "already applied"
    text = (site_copy / "petals" / "server" / "block_functions.py").read_text()
    assert text.index('step_metadata.get("start_from_position")') < text.index("flat_tensors = tuple(")


def test_patch_reverses_to_pristine_and_applies_again(site_copy: Path) -> None:
    """Undone, the file no longer mentions the field; applied again, it is byte-identical to the installed one."""
    ap = _applier()
    (fp,) = ap.parse(DIFF.read_text())
    target = site_copy / fp.path
    patched = target.read_text()
    target.write_text("".join(ap.plan_file(site_copy, fp, reverse=True)))
    assert "start_from_position" not in target.read_text()
    assert ap.apply_patch(site_copy, DIFF, check_only=False) == "applied"
    assert target.read_text() == patched


def test_client_rollback_cuts_history_and_sends_start_from_position_once() -> None:
    """The client side of 0003 on a real petals server session (its stream answered locally): a rollback cuts the
    input history and position, the next step's metadata carries start_from_position, the one after does not; each
    step first waits the emulated round trip; rolling forward is refused."""
    import asyncio
    import time

    import torch
    from hivemind.proto import runtime_pb2
    from hivemind.utils.serializer import MSGPackSerializer
    from petals.client.config import ClientConfig
    from petals.client.inference_session import _ServerInferenceSession

    from petals_chain.client.speculative import RollbackServerSession, WidthError

    async def scenario() -> list[dict]:
        """Two steps after a rollback; the metadata each one sent."""
        queue: asyncio.Queue = asyncio.Queue()

        async def answers():
            """The server's side of the stream: one empty response per request."""
            while True:
                yield runtime_pb2.ExpertResponse()

        s = RollbackServerSession.__new__(RollbackServerSession)
        _ServerInferenceSession.__init__(s, ClientConfig(), None, "model.0", {}, queue, answers(), max_length=16)
        s.stepped, s._position, s.history = True, 5, torch.arange(5.0).reshape(1, 5, 1)
        s.emulated_rtt_s = 0.05
        with pytest.raises(WidthError, match="cannot roll back to 6"):
            s.rollback(6)
        s.rollback(3)
        assert s._position == 3 and s.history.flatten().tolist() == [0.0, 1.0, 2.0]
        sent = []
        for step in ("x", "y"):
            t0 = time.perf_counter()
            await s._step(runtime_pb2.ExpertRequest(metadata=MSGPackSerializer.dumps({"step_id": step})))
            assert time.perf_counter() - t0 >= 0.05
            sent.append(MSGPackSerializer.loads((await queue.get()).metadata))
        s._outputs_stream = s._inputs_queue = None  # nothing to close on a server
        return sent

    first, second = asyncio.run(scenario())
    assert first == {"step_id": "x", "start_from_position": 3}
    assert second == {"step_id": "y"}
