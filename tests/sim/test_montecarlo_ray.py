"""The Ray backend of the Monte Carlo runner: a real local Ray (2 CPUs, started here) gives exactly the rows of the
serial path and of the process pool for the same seed, shares their checkpoints both ways, and a bad address is a
one-line error before anything runs. Ray is imported only when the backend is chosen."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from petals_chain.sim.montecarlo import (PoissonPolicyRun, RayBackendError, ReplicationSet, run_replication_sets,
                                         run_replications)

TASK = PoissonPolicyRun((2.0, 0.5), (2, 3), "SED", 2.5, 3000)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray(request: pytest.FixtureRequest):
    """A local Ray of 2 CPUs for this module's tests, shut down after them; run_replications(ray="auto") joins it.
    A new one even where a Ray cluster already runs on this machine (address "local"), which plain ray.init()
    would join instead."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    request.addfinalizer(ray.shutdown)
    return ray


def replications_in(path: Path) -> list[int]:
    """The replication index of every line of a checkpoint, in file order."""
    return [json.loads(line)["r"] for line in path.read_text().splitlines()]


def test_ray_gives_the_rows_of_the_serial_path_and_the_process_pool(local_ray) -> None:
    serial = run_replications(TASK, 4, seed=3, workers=1, progress=False)
    pool = run_replications(TASK, 4, seed=3, workers=2, progress=False)
    on_ray = run_replications(TASK, 4, seed=3, progress=False, ray="auto")
    one_at_a_time = run_replications(TASK, 4, seed=3, workers=1, progress=False, ray="auto")
    assert on_ray == serial == pool == one_at_a_time  # bit for bit: == on every float of every row
    assert [r["replication"] for r in on_ray] == [0, 1, 2, 3] and len({r["mean_response_s"] for r in on_ray}) == 4
    assert local_ray.is_initialized()  # the test's session was joined, not replaced


def test_a_checkpoint_written_by_one_backend_resumes_on_the_other(local_ray, tmp_path: Path) -> None:
    """Each backend computes only the replications the other did not write (one checkpoint line per computed
    replication), and the resumed rows equal an uninterrupted serial run's."""
    full = run_replications(TASK, 4, seed=5, workers=1, progress=False)
    pool_first = tmp_path / "pool-first.jsonl"
    run_replications(TASK, 4, seed=5, workers=2, progress=False, checkpoint=pool_first, only=[0, 1])
    assert replications_in(pool_first) in ([0, 1], [1, 0])
    resumed = run_replications(TASK, 4, seed=5, progress=False, checkpoint=pool_first, ray="auto")
    assert resumed == full and sorted(replications_in(pool_first)[2:]) == [2, 3]

    ray_first = tmp_path / "ray-first.jsonl"
    run_replications(TASK, 4, seed=5, progress=False, checkpoint=ray_first, only=[2], ray="auto")
    assert replications_in(ray_first) == [2]
    assert run_replications(TASK, 4, seed=5, workers=2, progress=False, checkpoint=ray_first) == full
    assert sorted(replications_in(ray_first)[1:]) == [0, 1, 3]
    assert run_replications(TASK, 4, seed=5, progress=False, checkpoint=ray_first, ray="auto") == full
    assert len(replications_in(ray_first)) == 4  # everything was there: nothing computed again


def test_replication_sets_give_each_sets_rows_and_checkpoint_on_either_backend(local_ray, tmp_path: Path) -> None:
    other = PoissonPolicyRun((2.0, 0.5), (2, 3), "JSQ", 2.5, 3000)
    alone = [run_replications(TASK, 3, seed=7, workers=1, progress=False),
             run_replications(other, 2, seed=8, workers=1, progress=False)]
    ckpt = tmp_path / "first.jsonl"
    run_replications(TASK, 3, seed=7, workers=1, progress=False, checkpoint=ckpt, only=[1])
    sets = [ReplicationSet(TASK, 3, 7, ckpt), ReplicationSet(other, 2, 8, tmp_path / "second.jsonl")]
    assert run_replication_sets(sets, progress=False, ray="auto") == alone
    assert sorted(replications_in(ckpt)[1:]) == [0, 2] and sorted(replications_in(tmp_path / "second.jsonl")) == [0, 1]
    assert run_replication_sets(sets, workers=2, progress=False) == alone  # all read back, nothing run again
    assert len(replications_in(ckpt)) == 3


@dataclass(frozen=True)
class Rendezvous:
    """A replication that says it has started and waits until ``other``'s has (True), or gives up after
    ``limit_s`` (False: the two were not in flight together); it marks its end with ``ME-done``."""

    folder: Path
    me: str
    other: str
    limit_s: float = 120.0

    def __call__(self, seed, index) -> dict:
        (self.folder / self.me).touch()
        deadline = time.monotonic() + self.limit_s
        while not (self.folder / self.other).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        met = (self.folder / self.other).exists()
        (self.folder / f"{self.me}-done").touch()
        return {"met": met}


@dataclass(frozen=True)
class Fails:
    """A replication that raises."""

    def __call__(self, seed, index) -> dict:
        raise ValueError("this replication fails")


BACKENDS = {"processes": {"workers": 2}, "ray": {"ray": "auto"}}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> dict:
    """run_replication_sets' arguments for a pool of 2 processes, or for the module's local Ray of 2 CPUs."""
    if request.param == "ray":
        request.getfixturevalue("local_ray")
    return BACKENDS[request.param]


def test_replication_sets_are_in_flight_together(backend: dict, tmp_path: Path) -> None:
    """Each set has one replication that waits for the other set's: one set after another would never meet (the
    pool and the local Ray have the 2 CPUs both need)."""
    sets = [ReplicationSet(Rendezvous(tmp_path, "a", "b"), 1, 0), ReplicationSet(Rendezvous(tmp_path, "b", "a"), 1, 0)]
    assert run_replication_sets(sets, progress=False, **backend) == [[{"met": True}], [{"met": True}]]


def test_a_failing_set_raises_and_on_ray_stops_the_others(backend: dict, tmp_path: Path) -> None:
    """The failure reaches the caller. On Ray the other set's replication, waiting for a partner that never comes,
    is stopped rather than waited for (a local pool lets a running replication finish and keeps its row: the next
    test)."""
    waits = Rendezvous(tmp_path, "waits", "nobody", limit_s=120.0 if "ray" in backend else 1.0)
    with pytest.raises(ValueError, match="this replication fails"):
        run_replication_sets([ReplicationSet(Fails(), 1, 0), ReplicationSet(waits, 1, 0)], progress=False, **backend)
    if "ray" in backend:
        assert (tmp_path / "waits").exists() and not (tmp_path / "waits-done").exists()


@dataclass(frozen=True)
class FailsAndSays:
    """A replication that leaves the file ``failed`` in ``folder`` and raises."""

    folder: Path

    def __call__(self, seed, index) -> dict:
        (self.folder / "failed").touch()
        raise ValueError("this replication fails")


@dataclass(frozen=True)
class FinishesAfterAFailure:
    """A replication that is running when another fails and finishes after it: it waits for the file ``failed``
    (the limit only ends a run that went wrong), then a moment more so that the pool has the failure first."""

    folder: Path
    limit_s: float = field(default=120.0, repr=False, compare=False)  # not in the checkpoint's key

    def __call__(self, seed, index) -> dict:
        deadline = time.monotonic() + self.limit_s
        while not (self.folder / "failed").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        return {"saw_the_failure": (self.folder / "failed").exists()}


def test_a_local_pool_keeps_the_rows_of_replications_that_finish_after_a_failure(tmp_path: Path) -> None:
    """The failure reaches the caller, and the replication that was running beside it is not thrown away: its row is
    in its set's checkpoint, so a rerun does not compute it again (for a seed of hours, that is the point)."""
    checkpoint = tmp_path / "survivor.jsonl"
    sets = [ReplicationSet(FailsAndSays(tmp_path), 1, 0), ReplicationSet(FinishesAfterAFailure(tmp_path), 1, 0,
                                                                          checkpoint)]
    with pytest.raises(ValueError, match="this replication fails"):
        run_replication_sets(sets, workers=2, progress=False)
    lines = [json.loads(line) for line in checkpoint.read_text().splitlines()]
    assert [(e["r"], e["row"]) for e in lines] == [(0, {"saw_the_failure": True})]
    (tmp_path / "failed").unlink()  # a rerun that computed it again would now wait out its limit and say False
    rerun = run_replications(FinishesAfterAFailure(tmp_path, limit_s=0.0), 1, 0, workers=2, progress=False,
                             checkpoint=checkpoint)
    assert rerun == [{"saw_the_failure": True}] and len(checkpoint.read_text().splitlines()) == 1


def test_a_bad_address_is_one_line_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ckpt = tmp_path / "never.jsonl"
    with pytest.raises(RayBackendError, match=r"^--ray 127\.0\.0\.1:1: no Ray head answers at 127\.0\.0\.1:1 \(") as e:
        run_replications(TASK, 2, seed=1, progress=False, checkpoint=ckpt, ray="127.0.0.1:1")
    assert "\n" not in str(e.value) and "ray start --head" in str(e.value) and not ckpt.exists()
    with pytest.raises(RayBackendError, match=r"^--ray: expected auto or a Ray head's HOST:PORT .*, got 'headnode'$"):
        run_replications(TASK, 2, seed=1, progress=False, ray="headnode")

    from petals_chain.cli import main as petals_chain_main
    from petals_chain.experiments.__main__ import main as experiments_main

    assert experiments_main(["fig8", "--quick", "--ray", "127.0.0.1:1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --ray 127.0.0.1:1: no Ray head answers") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written
    with pytest.raises(SystemExit) as exit_:
        experiments_main(["fig8", "--ray", "10.0.0.1:99999"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --ray: expected auto or a Ray head's HOST:PORT" in err
    assert petals_chain_main(["moldable", "simulate", "--n", "10", "--runs", "1", "--arrivals", "100",
                              "--ray", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --ray 127.0.0.1:1: no Ray head answers") and err.count("\n") == 1


def test_ray_is_imported_only_when_its_backend_is_chosen() -> None:
    code = ("import sys; import petals_chain.sim.montecarlo, petals_chain.experiments.__main__, "
            "petals_chain.moldable.cli; from petals_chain.sim.montecarlo import run_replications, PoissonPolicyRun; "
            "run_replications(PoissonPolicyRun((1.0,), (1,), 'SED', 0.5, 50), 1, 0, workers=1, progress=False); "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
