"""The testbed file format (YAML), checked by pydantic models before anything is started.

Format (docs/testbed.md; sizes and durations with units, read by :mod:`petals_chain.units`)::

    name: paper-mig                  # optional, default: the file name without .yaml
    model:
      name: llama-2-7b               # what the servers serve (a hub name or a label)
      path: ${REPO}/.cache/models/X  # optional local checkpoint directory (checked when servers start)
      blocks: 32                     # L
      block_size: 0.405 GB           # s_m: one block's weights (a bare number is bytes)
      cache_size: 0.0336 GB          # s_c: KV cache of one block for one job
    gpus:                            # EITHER MIG slices of real GPUs ...
      - index: 0                     # nvidia-smi GPU index
        type: A100-80GB              # A100-40GB | A100-80GB | H100-80GB | H100-94GB | H200-141GB
        profiles: [3g.40gb, 2g.20gb, 2g.20gb]   # one server per entry; {profile: 3g.40gb, name: s0} names it
    cpu_servers:                     # ... OR CPU-emulated servers
      - {name: s0, memory_budget: 1.311 GB, speed_factor: 1.0}
    latency:                         # round trip client <-> each server, one of:
      rtt: {s0: 20 ms, s1: 60 ms}    # explicit per server (a single duration applies to all)
      rtt_ms: {s0: 20, s1: 60}       # the older spelling: numbers of milliseconds
      ripe_atlas: {seed: 7}          # drawn by petals_chain.data.ripe.draw_topology (optional file:)
      method: auto                   # auto | netem | relay (how delays are made; auto = netem if the kernel has it)
    trace:                           # optional request trace (Azure LLM format), must exist
      path: ${DATA}/azure_llm_2023_code.csv
      requests: 1000                 # optional: replay only the first N
    network:                         # optional
      subnet: 10.213.0.0/16          # private IPv4 range for the /30 veth pairs (one per server)
      port: 31337                    # each server's listen port inside its namespace

Paths: ``${DATA}`` is the data folder (:func:`petals_chain.data.data_dir`), ``${REPO}`` the
repository root, other ``${VAR}`` come from the environment; a relative path is relative to the
testbed file (the ``base`` in the validation context). Servers without a ``name`` are called s0,
s1, ... in file order.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, PlainValidator, StrictStr, ValidationInfo, model_validator

from petals_chain.data import DataDirError, data_dir
from petals_chain.device_profile import device_name
from petals_chain.launch import mig_profiles
from petals_chain.schema import (
    FieldError,
    FileModel,
    PositiveInteger,
    Size,
    Text,
    exactly_one,
    one_or_per_key,
    parse_integer,
    parse_number,
)
from petals_chain.units import UnitError, parse_duration

REPO_ROOT = Path(__file__).resolve().parents[2]
DelayMethod = Literal["auto", "netem", "relay"]
DELAY_METHODS: tuple[str, ...] = get_args(DelayMethod)
DEFAULT_SUBNET = "10.213.0.0/16"
DEFAULT_PORT = 31337
TRACE_COLUMNS = ("ContextTokens", "GeneratedTokens")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# ---- field types ------------------------------------------------------------------------------------


def _name(value: Any) -> str:
    """A server or testbed name: letters, digits, '_', '.', '-' (it ends up in logs and file names)."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(f"expected a name of letters, digits, '_', '.', '-' (max 64), got {value!r}")
    return value


def expand_path(value: Any, base: Path) -> Path:
    """Expand ``${DATA}``, ``${REPO}`` and ``${ENV_VAR}``; make a relative path relative to ``base``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a path string, got {value!r}")

    def sub(m: re.Match) -> str:
        """The value of one ``${VAR}``."""
        var = m.group(1)
        if var == "DATA":
            try:
                return str(data_dir())
            except DataDirError as exc:
                raise ValueError(f"${{DATA}}: {exc}") from None
        if var == "REPO":
            return str(REPO_ROOT)
        if var in os.environ:
            return os.environ[var]
        raise ValueError(f"${{{var}}} is not set (known: DATA, REPO, or an environment variable)")

    path = Path(_VAR_RE.sub(sub, value)).expanduser()
    return path if path.is_absolute() else (base / path)


def _path_in_context(value: Any, info: ValidationInfo) -> Path:
    """expand_path relative to the ``base`` folder of the validation context (the testbed file's)."""
    return expand_path(value, (info.context or {}).get("base") or Path.cwd())


def _milliseconds(value: Any) -> float:
    """Seconds from a number of milliseconds (the older ``rtt_ms`` spelling)."""
    number = parse_number(value)
    if number < 0:
        raise UnitError(f"must be >= 0, got {value!r}")
    return number * 1e-3


def _subnet(value: Any) -> ipaddress.IPv4Network:
    """A private IPv4 network (``10.213.0.0/16``)."""
    try:
        subnet = ipaddress.IPv4Network(str(value), strict=True)
    except ValueError as err:
        raise ValueError(str(err)) from None
    if not subnet.is_private:
        raise ValueError(f"{subnet} is not a private range (use e.g. {DEFAULT_SUBNET})")
    return subnet


def _profile_entry(value: Any) -> Any:
    """A GPU's list entry: ``3g.40gb`` is short for ``{profile: 3g.40gb}``."""
    if isinstance(value, str):
        return {"profile": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a MIG profile name like '3g.40gb' (or {{profile: ..., name: ...}}), got {value!r}")
    return value


Name = Annotated[str, PlainValidator(_name)]
ResolvedPath = Annotated[Path, PlainValidator(_path_in_context)]
NonNegativeInteger = Annotated[int, BeforeValidator(parse_integer), Field(ge=0)]
SpeedFactor = Annotated[float, BeforeValidator(parse_number), Field(gt=0, le=1)]
Rtts = Annotated[float | dict[str, float], one_or_per_key(parse_duration)]
RttsMs = Annotated[float | dict[str, float], one_or_per_key(_milliseconds)]


# ---- sections ---------------------------------------------------------------------------------------


class ModelSection(FileModel):
    """``model``: the ModelSpec figures and the optional checkpoint directory."""

    name: Text
    path: ResolvedPath | None = None
    blocks: PositiveInteger
    block_size: Size
    cache_size: Size


class ProfileEntry(FileModel):
    """One MIG slice of a GPU: its profile and, optionally, the server's name."""

    profile: StrictStr
    name: Name | None = None


class GpuEntry(FileModel):
    """One GPU of ``gpus``: index, product and the MIG profiles to create on it (one server each)."""

    index: NonNegativeInteger
    type: StrictStr
    profiles: list[Annotated[ProfileEntry, BeforeValidator(_profile_entry)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits(self) -> GpuEntry:
        self.layout()
        return self

    def layout(self) -> tuple[mig_profiles.GpuProduct, tuple[str, ...], tuple[int, ...]]:
        """(product, canonical profile names, memory-slice starts); FieldError naming the profile that is wrong."""
        try:
            product = mig_profiles.product(self.type)
        except mig_profiles.MigProfileError as err:
            raise FieldError(str(err), "type") from None
        wanted = []
        for k, entry in enumerate(self.profiles):
            try:
                wanted.append(mig_profiles.profile(product, entry.profile).name)
            except mig_profiles.MigProfileError as err:
                raise FieldError(str(err), "profiles", k) from None
        try:
            starts = mig_profiles.place(product, wanted)
        except mig_profiles.MigProfileError as err:
            raise FieldError(f"GPU {self.index}: {err}", "profiles") from None
        return product, tuple(wanted), tuple(starts)


class CpuServer(FileModel):
    """One CPU stand-in: a memory budget and a speed factor (1 = the fastest kind), or an emulated ``device`` whose
    step times it keeps and whose memory it counts in (server/device_clock.py); a budget given beside a device
    overrides the device's memory."""

    name: Name | None = None
    memory_budget: Size | None = None
    speed_factor: SpeedFactor = 1.0
    device: Annotated[str, PlainValidator(device_name)] | None = None

    @model_validator(mode="after")
    def _sized(self) -> CpuServer:
        if self.device is None and self.memory_budget is None:
            raise ValueError("give 'memory_budget' (or an emulated 'device', whose memory it then has)")
        if self.device is not None and self.speed_factor != 1.0:
            raise FieldError("a server emulating a device keeps that device's time: no speed_factor", "speed_factor")
        return self

    @property
    def memory_bytes(self) -> float:
        """The budget, or the emulated device's memory."""
        if self.memory_budget is not None:
            return float(self.memory_budget)
        from petals_chain.device_profile import device

        return device(self.device).memory_bytes


class EmulationSection(FileModel):
    """``emulation``: the time dilation k of a testbed of emulated devices (every device time and delay × k)."""

    time_dilation: Annotated[float, BeforeValidator(parse_number), Field(ge=1, le=1000)] = 1.0


class RipeAtlas(FileModel):
    """``latency.ripe_atlas``: the seed of the draw and, optionally, another anchors file."""

    seed: NonNegativeInteger
    file: ResolvedPath | None = None


class LatencySection(FileModel):
    """``latency``: explicit RTTs or a RIPE Atlas draw, and how delays are made."""

    rtt: Rtts | None = None
    rtt_ms: RttsMs | None = None
    ripe_atlas: RipeAtlas | None = None
    method: DelayMethod = "auto"

    @model_validator(mode="after")
    def _one_source(self) -> LatencySection:
        if sum(x is not None for x in (self.rtt, self.rtt_ms, self.ripe_atlas)) != 1:
            raise ValueError("give exactly one of 'rtt' (e.g. 20 ms, or per server {s0: 20 ms}), 'rtt_ms' "
                             "(the older spelling, milliseconds) or 'ripe_atlas' ({seed: N})")
        return self

    @property
    def explicit(self) -> tuple[str, float | dict[str, float]] | None:
        """(key, RTT in seconds once or per server) of explicit RTTs; None for a RIPE Atlas draw."""
        key = exactly_one(self, "rtt", "rtt_ms", required=False)
        return (key, getattr(self, key)) if key is not None else None


class TraceSection(FileModel):
    """``trace``: an Azure LLM trace file (checked to exist, with the token columns) and how many requests."""

    path: ResolvedPath
    requests: PositiveInteger | None = None

    @model_validator(mode="after")
    def _readable(self) -> TraceSection:
        if not self.path.is_file():
            raise FieldError(f"trace file not found: {self.path}", "path")
        with self.path.open("r", encoding="utf-8", errors="replace") as fh:
            header = [c.strip() for c in fh.readline().split(",")]
        missing = [c for c in TRACE_COLUMNS if c not in header]
        if missing:
            raise FieldError(f"{self.path}:1: header lacks column(s) {', '.join(missing)}", "path")
        return self


class NetworkSection(FileModel):
    """``network``: the private subnet for the veth pairs and the servers' port."""

    subnet: Annotated[ipaddress.IPv4Network, PlainValidator(_subnet)] = ipaddress.IPv4Network(DEFAULT_SUBNET)
    port: Annotated[int, BeforeValidator(parse_integer), Field(ge=1024, le=65535)] = DEFAULT_PORT


class TestbedFile(FileModel):
    """A whole testbed file; cross-section checks (server names, RTTs per server, subnet size) included."""

    __test__ = False  # not a pytest test class despite the name

    name: Name | None = None
    model: ModelSection
    gpus: list[GpuEntry] | None = Field(None, min_length=1)
    cpu_servers: list[CpuServer] | None = Field(None, min_length=1)
    latency: LatencySection
    trace: TraceSection | None = None
    network: NetworkSection | None = None
    emulation: EmulationSection | None = None

    @property
    def net(self) -> NetworkSection:
        """The ``network`` section, defaults filled in when the file has none."""
        return self.network if self.network is not None else NetworkSection()

    def server_names(self) -> list[str]:
        """Every server's name in file order (unnamed ones are s0, s1, ... by position)."""
        given = ([p.name for g in self.gpus for p in g.profiles] if self.gpus is not None
                 else [s.name for s in self.cpu_servers or ()])
        return [n or f"s{j}" for j, n in enumerate(given)]

    @model_validator(mode="after")
    def _consistent(self) -> TestbedFile:
        if (self.gpus is None) == (self.cpu_servers is None):
            raise ValueError("give exactly one of 'gpus' (MIG slices) or 'cpu_servers' (CPU emulation)")
        devices = [s.device is not None for s in self.cpu_servers or ()]
        if any(devices) and not all(devices):
            raise FieldError("either every server emulates a device or none does", "cpu_servers")
        if self.emulation is not None and not any(devices):
            raise FieldError("time dilation needs servers that emulate a device ('device' on each cpu_server)",
                             "emulation")
        seen: set[int] = set()
        for g, gpu in enumerate(self.gpus or ()):
            if gpu.index in seen:
                raise FieldError(f"GPU {gpu.index} is listed twice", "gpus", g, "index")
            seen.add(gpu.index)
        names = self.server_names()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"server name(s) used twice: {', '.join(dup)}")
        explicit = self.latency.explicit
        if explicit is not None and isinstance(explicit[1], dict):
            unknown = [k for k in explicit[1] if k not in names]
            if unknown:
                raise FieldError(f"unknown server(s) {', '.join(unknown)} (servers: {', '.join(names)})",
                                 "latency", explicit[0])
            missing = [n for n in names if n not in explicit[1]]
            if missing:
                raise FieldError(f"no RTT for server(s) {', '.join(missing)}", "latency", explicit[0])
        subnet = self.net.subnet
        if 4 * (len(names) + 1) > subnet.num_addresses:
            raise FieldError(f"{subnet} has room for {subnet.num_addresses // 4 - 1} /30 pairs, "
                             f"{len(names)} servers need one each", "network", "subnet")
        return self

    def rtts_s(self) -> list[float] | None:
        """Explicit RTTs in seconds per server in file order; None for a RIPE Atlas draw."""
        explicit = self.latency.explicit
        if explicit is None:
            return None
        names = self.server_names()
        value = explicit[1]
        return [value[n] for n in names] if isinstance(value, dict) else [value] * len(names)
