"""Cluster description files (YAML or JSON): model, load and servers → ServerSpec/ModelSpec/Load.

The format (README.md, "Composing a cluster") is checked by the pydantic models below: unknown
keys are refused, sizes and durations carry units (``block_size: 1.32 GB``, ``rtt: 23.5 ms``,
read by :mod:`petals_chain.units`) and are converted to SI here and nowhere else. Files written
before units were accepted spell a figure as a plain number in the unit its key names
(``block_gb``, ``cache_gb``, ``memory_gb``, ``tau_p_s``, ``tau_c_s``, ``rtt_ms``,
``bandwidth_gb_per_s``); those still load, but a figure may be given in one spelling only.
Every error names the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import model_validator

from petals_chain import defaults
from petals_chain.model import GB, ModelSpec, ServerSpec, SpecError, validate_servers
from petals_chain.schema import (
    Duration,
    FieldError,
    FileModel,
    Fraction,
    NonNegativeNumber,
    PositiveDuration,
    PositiveInteger,
    PositiveNumber,
    Rate,
    Size,
    Text,
    UnitInterval,
    exactly_one,
    validate_document,
)
from petals_chain.service_time import PAPER_DEVICES, DeviceKind, Workload, tau_c, tau_p

_WORKLOAD = Workload()


@dataclass(frozen=True)
class Load:
    """Offered load: Poisson arrival rate λ (per second) and the target utilisation ρ̄."""

    arrival_rate: float
    target_load: float = defaults.TARGET_LOAD


@dataclass(frozen=True)
class Cluster:
    """Everything a cluster file describes."""

    servers: tuple[ServerSpec, ...]
    model: ModelSpec
    load: Load
    workload: Workload


# ---- the file format ------------------------------------------------------------------------------


class ModelSection(FileModel):
    """``model``: L blocks of s_m bytes, s_c bytes of KV cache per block per job."""

    name: Text = "model"
    blocks: PositiveInteger
    block_size: Size | None = None
    cache_size: Size | None = None
    block_gb: PositiveNumber | None = None  # older spelling of block_size, in GB
    cache_gb: PositiveNumber | None = None  # older spelling of cache_size, in GB

    @model_validator(mode="after")
    def _one_spelling(self) -> ModelSection:
        exactly_one(self, "block_size", "block_gb")
        exactly_one(self, "cache_size", "cache_gb")
        return self

    def spec(self) -> ModelSpec:
        """The ModelSpec (bytes)."""
        block = self.block_size if self.block_size is not None else self.block_gb * GB
        cache = self.cache_size if self.cache_size is not None else self.cache_gb * GB
        return ModelSpec(num_blocks=self.blocks, block_bytes=block, cache_bytes=cache, name=self.name)


class LoadSection(FileModel):
    """``load``: λ per second and the target utilisation ρ̄ in (0, 1)."""

    arrival_rate: PositiveNumber
    target_load: Fraction = defaults.TARGET_LOAD


class WorkloadSection(FileModel):
    """``workload``: token counts and prefill cost, used for τp and τc of servers given by device and RTT."""

    input_tokens: PositiveInteger = _WORKLOAD.input_tokens
    output_tokens: PositiveInteger = _WORKLOAD.output_tokens
    gflops_per_block_token: PositiveNumber = _WORKLOAD.flops_per_block_token / 1e9

    def workload(self) -> Workload:
        """The Workload (FLOPs, not GFLOPs)."""
        return Workload(self.input_tokens, self.output_tokens, self.gflops_per_block_token * 1e9)


class DeviceSection(FileModel):
    """One entry of ``devices``: memory, dense TFLOP/s and memory bandwidth of a GPU kind."""

    memory: Size | None = None
    memory_gb: PositiveNumber | None = None  # older spelling of memory, in GB
    tflops: PositiveNumber
    bandwidth: Rate | None = None
    bandwidth_gb_per_s: PositiveNumber | None = None  # older spelling of bandwidth, in GB/s

    @model_validator(mode="after")
    def _one_spelling(self) -> DeviceSection:
        exactly_one(self, "memory", "memory_gb")
        exactly_one(self, "bandwidth", "bandwidth_gb_per_s")
        return self

    def kind(self, name: str) -> DeviceKind:
        """The DeviceKind (bytes, FLOP/s, bytes/s)."""
        memory = self.memory if self.memory is not None else self.memory_gb * GB
        bandwidth = self.bandwidth if self.bandwidth is not None else self.bandwidth_gb_per_s * GB
        return DeviceKind(name, memory, self.tflops * 1e12, bandwidth)


class ServerRow(FileModel):
    """One server: explicit memory/τp/τc, or a device kind plus an RTT (explicit figures override the device's)."""

    name: Text
    device: Text | None = None
    memory: Size | None = None
    tau_p: PositiveDuration | None = None
    tau_c: Duration | None = None
    rtt: Duration | None = None
    memory_gb: PositiveNumber | None = None  # older spellings: numbers in the unit the key names
    tau_p_s: PositiveNumber | None = None
    tau_c_s: NonNegativeNumber | None = None
    rtt_ms: NonNegativeNumber | None = None
    serial_fraction: UnitInterval = 0.0  # part of τp computed one session at a time (compose/serial.py)
    batch_slowdown: tuple[PositiveNumber, ...] = ()  # τp(b)/τp(1) for b = 1..B (model.ServerSpec); overrides σ

    @model_validator(mode="after")
    def _one_spelling(self) -> ServerRow:
        need = self.device is None
        exactly_one(self, "memory", "memory_gb", required=need)
        exactly_one(self, "tau_p", "tau_p_s", required=need)
        if exactly_one(self, "tau_c", "tau_c_s", required=False) is None:
            exactly_one(self, "tau_c", "tau_c_s", "rtt", "rtt_ms")
        else:
            exactly_one(self, "rtt", "rtt_ms", required=False)
        return self

    def spec(self, model: ModelSpec, workload: Workload, devices: dict[str, DeviceKind]) -> ServerSpec:
        """The ServerSpec: τp by the paper's formula and memory from the device unless given; τc from the RTT."""
        device = devices[self.device] if self.device is not None else None
        if self.memory is not None or self.memory_gb is not None:
            memory = self.memory if self.memory is not None else self.memory_gb * GB
        else:
            memory = device.memory_bytes
        tp = next((t for t in (self.tau_p, self.tau_p_s) if t is not None), None)
        if tp is None:
            tp = tau_p(device, model.block_bytes, workload)
        tc = next((t for t in (self.tau_c, self.tau_c_s) if t is not None), None)
        if tc is None:
            rtt = self.rtt if self.rtt is not None else self.rtt_ms / 1e3
            tc = tau_c(rtt, workload)
        return ServerSpec(self.name, memory, tc, tp, self.serial_fraction, tuple(float(g) for g in self.batch_slowdown))


class ClusterFile(FileModel):
    """A whole cluster file."""

    model: ModelSection
    load: LoadSection
    workload: WorkloadSection | None = None
    devices: dict[str, DeviceSection] | None = None
    servers: list[ServerRow]

    @model_validator(mode="after")
    def _servers(self) -> ClusterFile:
        if not self.servers:
            raise FieldError("expected a non-empty list of servers", "servers")
        known = sorted({*PAPER_DEVICES, *(self.devices or {})})
        seen: set[str] = set()
        for i, row in enumerate(self.servers):
            if row.device is not None and row.device not in known:
                raise FieldError(f"unknown device {row.device!r}; known: {known}", "servers", i, "device")
            if row.name in seen:
                raise FieldError(f"duplicate server name {row.name!r}", "servers", i, "name")
            seen.add(row.name)
        return self


# ---- reading ----------------------------------------------------------------------------------------


def parse_cluster(raw: Any, where: str = "cluster") -> Cluster:
    """Validate a decoded cluster document and build the specs; SpecError naming ``where`` and the field."""
    doc = validate_document(ClusterFile, raw, where)
    model = doc.model.spec()
    workload = (doc.workload or WorkloadSection()).workload()
    devices = dict(PAPER_DEVICES) | {name: d.kind(name) for name, d in (doc.devices or {}).items()}
    servers = [row.spec(model, workload, devices) for row in doc.servers]
    load = Load(doc.load.arrival_rate, doc.load.target_load)
    return Cluster(validate_servers(servers), model, load, workload)


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster file (.yaml/.yml/.json) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"cluster file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    return parse_cluster(raw, str(path))
