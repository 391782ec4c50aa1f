"""Cluster description files (YAML or JSON): model, load and servers → ServerSpec/ModelSpec/Load.

Units in files are the ones people write (GB, seconds, milliseconds); they are
converted to SI here and nowhere else. Every error names the file and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from petals_chain.model import GB, ModelSpec, ServerSpec, SpecError, validate_servers
from petals_chain.service_time import PAPER_DEVICES, DeviceKind, Workload, tau_c, tau_p


@dataclass(frozen=True)
class Load:
    """Offered load: Poisson arrival rate λ (per second) and the target utilisation ρ̄."""

    arrival_rate: float
    target_load: float = 0.7


@dataclass(frozen=True)
class Cluster:
    """Everything a cluster file describes."""

    servers: tuple[ServerSpec, ...]
    model: ModelSpec
    load: Load
    workload: Workload


def _num(where: str, obj: dict, key: str, *, default: Any = None, positive: bool = True) -> float:
    """Read a finite number field, with a message naming it when it is missing or wrong."""
    if key not in obj:
        if default is not None:
            return default
        raise SpecError(f"{where}: missing field '{key}'")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{where}: field '{key}' must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise SpecError(f"{where}: field '{key}' must be > 0, got {v!r}")
    if not positive and v < 0:
        raise SpecError(f"{where}: field '{key}' must be >= 0, got {v!r}")
    return float(v)


def _section(where: str, raw: dict, key: str) -> dict:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise SpecError(f"{where}: missing or malformed section '{key}' (expected a mapping)")
    return value


def parse_cluster(raw: Any, where: str = "cluster") -> Cluster:
    """Validate a decoded cluster document and build the specs."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: expected a mapping at top level, got {type(raw).__name__}")
    m = _section(where, raw, "model")
    blocks = m.get("blocks")
    if isinstance(blocks, bool) or not isinstance(blocks, int):
        raise SpecError(f"{where}: model field 'blocks' must be an integer, got {blocks!r}")
    model = ModelSpec(
        num_blocks=blocks,
        block_bytes=_num(f"{where}: model", m, "block_gb") * GB,
        cache_bytes=_num(f"{where}: model", m, "cache_gb") * GB,
        name=str(m.get("name", "model")),
    )
    ld = _section(where, raw, "load")
    load = Load(_num(f"{where}: load", ld, "arrival_rate"), _num(f"{where}: load", ld, "target_load", default=0.7))
    if not 0 < load.target_load < 1:
        raise SpecError(f"{where}: load field 'target_load' must be in (0, 1), got {load.target_load}")
    wl = raw.get("workload", {}) or {}
    if not isinstance(wl, dict):
        raise SpecError(f"{where}: section 'workload' must be a mapping")
    workload = Workload(
        input_tokens=int(_num(f"{where}: workload", wl, "input_tokens", default=2000)),
        output_tokens=int(_num(f"{where}: workload", wl, "output_tokens", default=20)),
        flops_per_block_token=_num(f"{where}: workload", wl, "gflops_per_block_token", default=5.0) * 1e9,
    )
    devices = dict(PAPER_DEVICES)
    for name, d in (raw.get("devices") or {}).items():
        w = f"{where}: device {name!r}"
        if not isinstance(d, dict):
            raise SpecError(f"{w}: expected a mapping")
        devices[name] = DeviceKind(
            name, _num(w, d, "memory_gb") * GB, _num(w, d, "tflops") * 1e12, _num(w, d, "bandwidth_gb_per_s") * GB
        )
    rows = raw.get("servers")
    if not isinstance(rows, list) or not rows:
        raise SpecError(f"{where}: 'servers' must be a non-empty list")
    servers = [_parse_server(f"{where}: servers[{i}]", row, model, workload, devices) for i, row in enumerate(rows)]
    return Cluster(validate_servers(servers), model, load, workload)


def _parse_server(where: str, row: Any, model: ModelSpec, workload: Workload, devices: dict) -> ServerSpec:
    """One server row: explicit memory/τc/τp, or a device kind plus an RTT."""
    if not isinstance(row, dict):
        raise SpecError(f"{where}: expected a mapping")
    name = row.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}: field 'name' must be a non-empty string")
    where = f"{where} ({name})"
    device = None
    if "device" in row:
        device = devices.get(row["device"])
        if device is None:
            raise SpecError(f"{where}: unknown device {row['device']!r}; known: {sorted(devices)}")
    if "memory_gb" in row or device is None:
        memory = _num(where, row, "memory_gb") * GB
    else:
        memory = device.memory_bytes
    if "tau_p_s" in row or device is None:
        tp = _num(where, row, "tau_p_s")
    else:
        tp = tau_p(device, model.block_bytes, workload)
    if "tau_c_s" in row:
        tc = _num(where, row, "tau_c_s", positive=False)
    elif "rtt_ms" in row:
        tc = tau_c(_num(where, row, "rtt_ms", positive=False) / 1e3, workload)
    else:
        raise SpecError(f"{where}: give 'tau_c_s' or 'rtt_ms'")
    return ServerSpec(name, memory, tc, tp)


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
