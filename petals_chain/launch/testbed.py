"""Testbed files (YAML): which servers to run (MIG slices or CPU stand-ins), the model, the delays, the trace.

A testbed file is validated completely before anything is started (the format and its checks:
:mod:`petals_chain.launch.testbed_format`); every error names the file and the field
(``paper_mig.yaml: gpus[1].profiles[2]: unknown MIG profile ...``). This module turns a valid
file into a :class:`Testbed` in SI units, drawing RIPE Atlas RTTs where the file asks for them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from petals_chain.data.ripe import draw_topology, load_ripe_atlas
from petals_chain.launch.testbed_format import TestbedFile
from petals_chain.model import ModelSpec, SpecError
from petals_chain.schema import validate_document


class TestbedError(SpecError):
    """A testbed file is malformed or names something that does not exist; the message names the file and field."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class TestbedServer:
    """One server of the testbed: a MIG slice (gpu_index, profile, placement start) or a CPU stand-in."""

    __test__ = False

    name: str
    kind: str  # "mig" or "cpu"
    memory_bytes: float
    rtt_s: float
    speed_factor: float = 1.0
    gpu_index: int | None = None
    profile: str | None = None
    placement: int | None = None
    device: str | None = None  # an emulated device (petals_chain.device_profile); rtt_s is then already × k


@dataclass(frozen=True)
class GpuRequest:
    """The MIG layout wanted on one GPU: its index, product key, profiles and their memory-slice starts."""

    index: int
    product: str
    profiles: tuple[str, ...]
    placements: tuple[int, ...]


@dataclass(frozen=True)
class TraceSpec:
    """The request trace to replay and how many of its requests (None = all)."""

    path: Path
    requests: int | None


@dataclass(frozen=True)
class Testbed:
    """A validated testbed file."""

    __test__ = False

    name: str
    source: Path | None
    model: ModelSpec
    model_path: Path | None
    servers: tuple[TestbedServer, ...]
    gpus: tuple[GpuRequest, ...]
    latency_source: str  # "explicit" or "ripe_atlas"
    seed: int | None
    delay_method: str
    trace: TraceSpec | None
    subnet: ipaddress.IPv4Network
    port: int
    time_dilation: float = 1.0  # every device time and round trip × k (rtt_s of the servers include it)

    @property
    def emulated(self) -> bool:
        """True when every server emulates a named device (server/device_clock.py)."""
        return bool(self.servers) and all(s.device is not None for s in self.servers)

    def with_dilation(self, k: float) -> Testbed:
        """This testbed with time dilated by ``k`` instead of its own: round trips rescaled (the devices' times
        follow ``time_dilation``, which every emulated server is started with)."""
        if not self.emulated:
            raise TestbedError(f"{self.source or self.name}: time dilation needs servers that emulate a device")
        if not k >= 1:
            raise TestbedError(f"time dilation must be >= 1, got {k!r}")
        servers = tuple(replace(s, rtt_s=s.rtt_s / self.time_dilation * k) for s in self.servers)
        return replace(self, servers=servers, time_dilation=float(k))

    @property
    def is_mig(self) -> bool:
        """True when the servers are MIG slices of real GPUs (False: CPU-emulated)."""
        return bool(self.gpus)

    def warnings(self) -> list[str]:
        """Things that do not stop planning or delay measurement but would stop servers from starting."""
        if self.model_path is not None and not self.model_path.is_dir():
            return [f"model.path: directory not found: {self.model_path} (scripts/prepare_model.sh makes SmolLM2)"]
        return []

    def require_model(self) -> None:
        """Raise TestbedError if the model directory the servers need is missing."""
        for w in self.warnings():
            raise TestbedError(f"{self.source or self.name}: {w}")


def parse_testbed(raw: Any, where: str = "testbed", base: Path | None = None, name: str | None = None) -> Testbed:
    """Validate a decoded testbed document (see testbed_format) and build the :class:`Testbed`."""
    base = base if base is not None else Path.cwd()
    doc = validate_document(TestbedFile, raw, where, error=TestbedError, context={"base": base})
    names = doc.server_names()
    rtts = doc.rtts_s()
    source, seed = "explicit", None
    if rtts is None:
        rtts, seed = _ripe_rtts(f"{where}: latency.ripe_atlas", doc, len(names)), doc.latency.ripe_atlas.seed
        source = "ripe_atlas"
    servers, gpus = [], []
    k = doc.emulation.time_dilation if doc.emulation is not None else 1.0  # emulated devices: round trips × k
    if doc.gpus is not None:
        slices = []
        for gpu in doc.gpus:
            product, profiles, starts = gpu.layout()
            gpus.append(GpuRequest(gpu.index, product.key, profiles, starts))
            slices += [(gpu.index, product.profiles[p], s) for p, s in zip(profiles, starts)]
        for nm, rtt, (index, prof, start) in zip(names, rtts, slices):
            servers.append(TestbedServer(nm, "mig", prof.memory_bytes, rtt, 1.0, index, prof.name, start))
    else:
        for nm, rtt, cpu in zip(names, rtts, doc.cpu_servers):
            servers.append(TestbedServer(nm, "cpu", cpu.memory_bytes, rtt * (k if cpu.device else 1.0),
                                         cpu.speed_factor, device=cpu.device))
    m = doc.model
    model = ModelSpec(m.blocks, m.block_size, m.cache_size, name=m.name)
    trace = TraceSpec(doc.trace.path, doc.trace.requests) if doc.trace is not None else None
    return Testbed(doc.name or name or "testbed", None, model, m.path, tuple(servers), tuple(gpus), source, seed,
                   doc.latency.method, trace, doc.net.subnet, doc.net.port, k)


def _ripe_rtts(where: str, doc: TestbedFile, n_servers: int) -> list[float]:
    """RTTs (s) of ``n_servers`` drawn from the RIPE Atlas anchors with the file's seed."""
    ripe = doc.latency.ripe_atlas
    try:
        anchors = load_ripe_atlas(ripe.file)
        topo = draw_topology(n_servers, np.random.default_rng(ripe.seed), anchors)
    except (FileNotFoundError, SpecError) as err:
        raise TestbedError(f"{where}: {err}") from None
    return [float(x) for x in topo.server_rtt_s]


def load_testbed(path: str | Path) -> Testbed:
    """Read and validate a testbed YAML file; TestbedError naming the file (and line, for YAML syntax errors)."""
    path = Path(path)
    if not path.is_file():
        raise TestbedError(f"testbed file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise TestbedError(f"{path}{line}: not valid YAML: {problem}") from None
    tb = parse_testbed(raw, where=path.name, base=path.resolve().parent, name=path.stem.replace("_", "-"))
    return Testbed(**{**tb.__dict__, "source": path.resolve()})
