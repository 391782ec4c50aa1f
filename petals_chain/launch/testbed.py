"""Testbed files (YAML): which servers to run (MIG slices or CPU stand-ins), the model, the delays, the trace.

A testbed file is validated completely before anything is started; every error names the
file and the field (``paper_mig.yaml: gpus[1].profiles[2]: unknown MIG profile ...``).

Format (units as people write them; converted to SI here)::

    name: paper-mig                  # optional, default: the file name without .yaml
    model:
      name: llama-2-7b               # what the servers serve (a hub name or a label)
      path: ${REPO}/.cache/models/X  # optional local checkpoint directory (checked when servers start)
      blocks: 32                     # L
      block_size: 0.405GB            # s_m: one block's weights (number = bytes, or "14.2MB", "0.4GiB", ...)
      cache_size: 0.0671GB           # s_c: KV cache of one block for one job
    gpus:                            # EITHER MIG slices of real GPUs ...
      - index: 0                     # nvidia-smi GPU index
        type: A100-80GB              # A100-40GB | A100-80GB | H100-80GB | H100-94GB | H200-141GB
        profiles: [3g.40gb, 2g.20gb, 2g.20gb]   # one server per entry; {profile: 3g.40gb, name: s0} names it
    cpu_servers:                     # ... OR CPU-emulated servers
      - {name: s0, memory_budget: 1.311GB, speed_factor: 1.0}
    latency:                         # round trip client <-> each server
      rtt_ms: {s0: 20, s1: 60}       # explicit per server (a single number applies to all), OR
      ripe_atlas: {seed: 7}          # drawn by petals_chain.data.ripe.draw_topology (optional file:)
      method: auto                   # auto | netem | relay (how delays are made; auto = netem if the kernel has it)
    trace:                           # optional request trace (Azure LLM format), must exist
      path: ${DATA}/azure_llm_2023_code.csv
      requests: 1000                 # optional: replay only the first N
    network:                         # optional
      subnet: 10.213.0.0/16          # private IPv4 range for the /30 veth pairs (one per server)
      port: 31337                    # each server's listen port inside its namespace

Paths: ``${DATA}`` is the shared data folder (:func:`petals_chain.data.data_dir`),
``${REPO}`` the repository root, other ``${VAR}`` come from the environment; a relative path is
relative to the testbed file. Servers without a ``name`` are called s0, s1, ... in file order.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from petals_chain.launch import mig_profiles
from petals_chain.model import ModelSpec, SpecError
from petals_chain.data import DataDirError, data_dir
from petals_chain.data.ripe import draw_topology, load_ripe_atlas

REPO_ROOT = Path(__file__).resolve().parents[2]
DELAY_METHODS = ("auto", "netem", "relay")
DEFAULT_SUBNET = "10.213.0.0/16"
DEFAULT_PORT = 31337
TRACE_COLUMNS = ("ContextTokens", "GeneratedTokens")
_UNITS = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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


def parse_size(value: Any, where: str) -> float:
    """Bytes from a number or a string with a unit (``14.2MB``, ``0.5GiB``); TestbedError naming ``where``."""
    if isinstance(value, bool):
        raise TestbedError(f"{where}: expected a size (bytes or e.g. '1.5GB'), got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise TestbedError(f"{where}: expected a size (bytes or e.g. '1.5GB'), got {value!r}")
    if unit not in _UNITS:
        raise TestbedError(f"{where}: unknown unit {unit!r} in {value!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size <= 0:
        raise TestbedError(f"{where}: size must be > 0, got {value!r}")
    return size


def _mapping(where: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    """Check that ``value`` is a mapping with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(value, Mapping):
        raise TestbedError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    unknown = [str(k) for k in value if k not in allowed]
    if unknown:
        raise TestbedError(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})")
    missing = [k for k in required if k not in value]
    if missing:
        raise TestbedError(f"{where}: missing field(s) {', '.join(missing)}")
    return dict(value)


def _number(where: str, value: Any, *, positive: bool = True) -> float:
    """A finite number (> 0 when ``positive``, else >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TestbedError(f"{where}: expected a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise TestbedError(f"{where}: must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _integer(where: str, value: Any, minimum: int) -> int:
    """An integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TestbedError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _name(where: str, value: Any) -> str:
    """A server or testbed name: letters, digits, '_', '.', '-' (it ends up in logs and file names)."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise TestbedError(f"{where}: expected a name of letters, digits, '_', '.', '-' (max 64), got {value!r}")
    return value


def resolve_path(where: str, value: Any, base: Path) -> Path:
    """Expand ``${DATA}``, ``${REPO}`` and ``${ENV_VAR}``; make a relative path relative to ``base``."""
    if not isinstance(value, str) or not value.strip():
        raise TestbedError(f"{where}: expected a path string, got {value!r}")

    def sub(m: re.Match) -> str:
        """The value of one ``${VAR}``."""
        var = m.group(1)
        if var == "DATA":
            try:
                return str(data_dir())
            except DataDirError as exc:
                raise TestbedError(f"{where}: ${{DATA}}: {exc}") from None
        if var == "REPO":
            return str(REPO_ROOT)
        if var in os.environ:
            return os.environ[var]
        raise TestbedError(f"{where}: ${{{var}}} is not set (known: DATA, REPO, or an environment variable)")

    path = Path(_VAR_RE.sub(sub, value)).expanduser()
    return path if path.is_absolute() else (base / path)


def _model(where: str, raw: Any, base: Path) -> tuple[ModelSpec, Path | None]:
    """Parse ``model``: the ModelSpec and the optional checkpoint directory."""
    m = _mapping(where, raw, ("name", "path", "blocks", "block_size", "cache_size"),
                 ("name", "blocks", "block_size", "cache_size"))
    name = m["name"]
    if not isinstance(name, str) or not name:
        raise TestbedError(f"{where}.name: expected a non-empty string, got {name!r}")
    path = resolve_path(f"{where}.path", m["path"], base) if m.get("path") is not None else None
    spec = ModelSpec(_integer(f"{where}.blocks", m["blocks"], 1), parse_size(m["block_size"], f"{where}.block_size"),
                     parse_size(m["cache_size"], f"{where}.cache_size"), name=name)
    return spec, path


def _gpus(where: str, raw: Any) -> tuple[list[GpuRequest], list[tuple[str | None, int, str, int]]]:
    """Parse ``gpus``: per GPU its request, and per server (name or None, gpu index, profile, start)."""
    if not isinstance(raw, list) or not raw:
        raise TestbedError(f"{where}: expected a non-empty list of GPUs")
    requests, servers, seen = [], [], set()
    for g, entry in enumerate(raw):
        here = f"{where}[{g}]"
        e = _mapping(here, entry, ("index", "type", "profiles"), ("index", "type", "profiles"))
        index = _integer(f"{here}.index", e["index"], 0)
        if index in seen:
            raise TestbedError(f"{here}.index: GPU {index} is listed twice")
        seen.add(index)
        try:
            prod = mig_profiles.product(e["type"]) if isinstance(e["type"], str) else None
        except mig_profiles.MigProfileError as err:
            raise TestbedError(f"{here}.type: {err}") from None
        if prod is None:
            raise TestbedError(f"{here}.type: expected a GPU type string, got {e['type']!r}")
        profiles = e["profiles"]
        if not isinstance(profiles, list) or not profiles:
            raise TestbedError(f"{here}.profiles: expected a non-empty list of MIG profiles")
        names: list[str | None] = []
        wanted: list[str] = []
        for k, p in enumerate(profiles):
            at = f"{here}.profiles[{k}]"
            if isinstance(p, Mapping):
                pm = _mapping(at, p, ("profile", "name"), ("profile",))
                names.append(_name(f"{at}.name", pm["name"]) if "name" in pm else None)
                p = pm["profile"]
            else:
                names.append(None)
            if not isinstance(p, str):
                raise TestbedError(f"{at}: expected a MIG profile name like '3g.40gb', got {p!r}")
            try:
                wanted.append(mig_profiles.profile(prod, p).name)
            except mig_profiles.MigProfileError as err:
                raise TestbedError(f"{at}: {err}") from None
        try:
            starts = mig_profiles.place(prod, wanted)
        except mig_profiles.MigProfileError as err:
            raise TestbedError(f"{here}.profiles: GPU {index}: {err}") from None
        requests.append(GpuRequest(index, prod.key, tuple(wanted), starts))
        servers.extend((n, index, p, s) for n, p, s in zip(names, wanted, starts))
    return requests, servers


def _cpu_servers(where: str, raw: Any) -> list[tuple[str | None, float, float]]:
    """Parse ``cpu_servers``: (name or None, memory budget bytes, speed factor) per server."""
    if not isinstance(raw, list) or not raw:
        raise TestbedError(f"{where}: expected a non-empty list of servers")
    out = []
    for k, entry in enumerate(raw):
        here = f"{where}[{k}]"
        e = _mapping(here, entry, ("name", "memory_budget", "speed_factor"), ("memory_budget",))
        name = _name(f"{here}.name", e["name"]) if "name" in e else None
        speed = _number(f"{here}.speed_factor", e.get("speed_factor", 1.0))
        if speed > 1.0:
            raise TestbedError(f"{here}.speed_factor: must be in (0, 1] (1 = the fastest kind), got {speed!r}")
        out.append((name, parse_size(e["memory_budget"], f"{here}.memory_budget"), speed))
    return out


def _latency(where: str, raw: Any, names: list[str], base: Path) -> tuple[list[float], str, int | None, str]:
    """Per-server RTT (s), the source ("explicit"/"ripe_atlas"), the seed, and the delay method."""
    lat = _mapping(where, raw, ("rtt_ms", "ripe_atlas", "method"))
    method = lat.get("method", "auto")
    if method not in DELAY_METHODS:
        raise TestbedError(f"{where}.method: expected one of {', '.join(DELAY_METHODS)}, got {method!r}")
    if ("rtt_ms" in lat) == ("ripe_atlas" in lat):
        raise TestbedError(f"{where}: give exactly one of 'rtt_ms' (explicit) or 'ripe_atlas' ({{seed: N}})")
    if "rtt_ms" in lat:
        r = lat["rtt_ms"]
        if isinstance(r, Mapping):
            unknown = [str(k) for k in r if k not in names]
            if unknown:
                raise TestbedError(
                    f"{where}.rtt_ms: unknown server(s) {', '.join(unknown)} (servers: {', '.join(names)})")
            missing = [n for n in names if n not in r]
            if missing:
                raise TestbedError(f"{where}.rtt_ms: no RTT for server(s) {', '.join(missing)}")
            rtts = [_number(f"{where}.rtt_ms.{n}", r[n], positive=False) * 1e-3 for n in names]
        else:
            rtts = [_number(f"{where}.rtt_ms", r, positive=False) * 1e-3] * len(names)
        return rtts, "explicit", None, method
    ra = _mapping(f"{where}.ripe_atlas", lat["ripe_atlas"], ("seed", "file"), ("seed",))
    seed = _integer(f"{where}.ripe_atlas.seed", ra["seed"], 0)
    file = resolve_path(f"{where}.ripe_atlas.file", ra["file"], base) if "file" in ra else None
    try:
        anchors = load_ripe_atlas(file)
        topo = draw_topology(len(names), np.random.default_rng(seed), anchors)
    except (FileNotFoundError, SpecError) as err:
        raise TestbedError(f"{where}.ripe_atlas: {err}") from None
    return [float(x) for x in topo.server_rtt_s], "ripe_atlas", seed, method


def _trace(where: str, raw: Any, base: Path) -> TraceSpec:
    """Parse ``trace``: the file must exist and have the Azure trace columns."""
    t = _mapping(where, raw, ("path", "requests"), ("path",))
    path = resolve_path(f"{where}.path", t["path"], base)
    if not path.is_file():
        raise TestbedError(f"{where}.path: trace file not found: {path}")
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        header = [c.strip() for c in fh.readline().split(",")]
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise TestbedError(f"{where}.path: {path}:1: header lacks column(s) {', '.join(missing)}")
    requests = _integer(f"{where}.requests", t["requests"], 1) if t.get("requests") is not None else None
    return TraceSpec(path, requests)


def _network(where: str, raw: Any, n_servers: int) -> tuple[ipaddress.IPv4Network, int]:
    """Parse ``network``: a private subnet with a /30 per server, and the servers' port."""
    nw = _mapping(where, raw if raw is not None else {}, ("subnet", "port"))
    try:
        subnet = ipaddress.IPv4Network(str(nw.get("subnet", DEFAULT_SUBNET)), strict=True)
    except ValueError as err:
        raise TestbedError(f"{where}.subnet: {err}") from None
    if not subnet.is_private:
        raise TestbedError(f"{where}.subnet: {subnet} is not a private range (use e.g. {DEFAULT_SUBNET})")
    if 4 * (n_servers + 1) > subnet.num_addresses:
        raise TestbedError(f"{where}.subnet: {subnet} has room for {subnet.num_addresses // 4 - 1} /30 pairs, "
                           f"{n_servers} servers need one each")
    port = _integer(f"{where}.port", nw.get("port", DEFAULT_PORT), 1024)
    if port > 65535:
        raise TestbedError(f"{where}.port: expected a TCP port <= 65535, got {port}")
    return subnet, port


def parse_testbed(raw: Any, where: str = "testbed", base: Path | None = None, name: str | None = None) -> Testbed:
    """Validate a decoded testbed document (see the module docstring) and build the :class:`Testbed`."""
    base = base if base is not None else Path.cwd()
    top = _mapping(where, raw, ("name", "model", "gpus", "cpu_servers", "latency", "trace", "network"),
                   ("model", "latency"))
    tb_name = _name(f"{where}: name", top["name"]) if "name" in top else (name or "testbed")
    model, model_path = _model(f"{where}: model", top["model"], base)
    if ("gpus" in top) == ("cpu_servers" in top):
        raise TestbedError(f"{where}: give exactly one of 'gpus' (MIG slices) or 'cpu_servers' (CPU emulation)")
    if "gpus" in top:
        gpus, mig = _gpus(f"{where}: gpus", top["gpus"])
        drafts = [(n, 0.0, 1.0, g, p, s) for n, g, p, s in mig]
    else:
        gpus = []
        drafts = [(n, budget, speed, None, None, None)
                  for n, budget, speed in _cpu_servers(f"{where}: cpu_servers", top["cpu_servers"])]
    names = [d[0] or f"s{j}" for j, d in enumerate(drafts)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TestbedError(f"{where}: server name(s) used twice: {', '.join(dup)}")
    rtts, source, seed, method = _latency(f"{where}: latency", top["latency"], names, base)
    servers = []
    for (_, budget, speed, gpu, prof, start), nm, rtt in zip(drafts, names, rtts):
        if gpu is not None:
            prod = mig_profiles.PRODUCTS[next(g.product for g in gpus if g.index == gpu)]
            servers.append(TestbedServer(nm, "mig", prod.profiles[prof].memory_bytes, rtt, 1.0, gpu, prof, start))
        else:
            servers.append(TestbedServer(nm, "cpu", budget, rtt, speed))
    trace = _trace(f"{where}: trace", top["trace"], base) if top.get("trace") is not None else None
    subnet, port = _network(f"{where}: network", top.get("network"), len(servers))
    return Testbed(tb_name, None, model, model_path, tuple(servers), tuple(gpus), source, seed, method, trace,
                   subnet, port)


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
