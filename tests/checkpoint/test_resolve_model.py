"""A model named the way petals.cli.run_server takes it: a Hugging Face repository name found in the local cache
(offline, never downloaded) or a directory; what is neither is refused with one line naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from petals_chain.checkpoint.resolve import model_display_name, resolve_model, seed_hub_cache
from petals_chain.checkpoint.resolve import ModelDirError
from petals_chain.checkpoint.sizing import block_sizes

REPO = Path(__file__).resolve().parents[2]
SMOL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
needs_smol = pytest.mark.skipif(not (SMOL / "config.json").is_file(), reason="needs scripts/prepare_model.sh")


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache in tmp_path, offline."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@needs_smol
def test_a_cached_repository_resolves_to_its_snapshot_and_sizes_like_the_directory(offline_cache: Path) -> None:
    snapshot = seed_hub_cache(SMOL, REPO_ID, offline_cache)
    assert (offline_cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "refs" / "main").is_file()
    assert resolve_model(REPO_ID) == snapshot.resolve()
    assert block_sizes(REPO_ID, "float32", 512) == block_sizes(SMOL, "float32", 512)
    assert block_sizes(REPO_ID, "bfloat16", 512, "nf4") == block_sizes(SMOL, "bfloat16", 512, "nf4")
    assert model_display_name(REPO_ID) == REPO_ID and model_display_name(str(SMOL) + "/") == SMOL.name


def test_an_uncached_repository_is_refused_offline_naming_it(offline_cache: Path) -> None:
    with pytest.raises(ModelDirError, match=r"model 'nobody/no-such-model' was not found in the local Hugging "
                                            r"Face cache .*hub \(HF_HUB_OFFLINE=1\)"):
        resolve_model("nobody/no-such-model")


@pytest.mark.parametrize("name, words", [
    ("not a/valid//name", "neither a directory nor a Hugging Face repository name"),
    ("", "give a checkpoint directory or a Hugging Face repository name"),
])
def test_nonsense_names_are_refused(offline_cache: Path, name: str, words: str) -> None:
    with pytest.raises(ModelDirError, match=words):
        resolve_model(name)


def test_a_directory_without_config_is_refused_saying_so(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelDirError, match="has no config.json: not a Hugging Face checkpoint"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("module", ["petals_chain.server", "petals_chain.orchestrator"])
def test_command_lines_refuse_an_unknown_model_in_one_line_exit_2(module: str, offline_cache: Path) -> None:
    args = (["nobody/no-such-model", "--orchestrator", "http://127.0.0.1:9", "--memory-budget", "1GB"]
            if module == "petals_chain.server" else ["--model", "nobody/no-such-model"])
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 2, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and "Warning" not in ln and "pytree" not in ln]
    assert len(lines) == 1 and "'nobody/no-such-model' was not found" in lines[0], out.stderr


@needs_smol
def test_the_client_looks_a_repository_up_as_the_servers_do(offline_cache: Path, tmp_path: Path) -> None:
    """Offline, the leasing client loads a repository name from the same cache snapshot; a directory must exist."""
    from petals_chain.client.model import _local_model

    snapshot = seed_hub_cache(SMOL, REPO_ID, offline_cache)
    assert _local_model(REPO_ID) == str(snapshot.resolve())
    assert _local_model(str(SMOL)) == str(SMOL.resolve())
    with pytest.raises(ModelDirError, match="does not exist"):
        _local_model(str(tmp_path / "elsewhere"))
