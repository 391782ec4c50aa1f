"""Reading ``nvidia-smi``: the GPUs, their MIG mode, devices, profiles, placements and instances, as data.

``--query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader`` (which GPUs, MIG capable or
enabled), ``-L`` (GPU and ``MIG-...`` UUIDs), ``mig -lgip`` / ``-lgipp`` (profiles offered and their
placements), ``mig -lgi`` / ``-lci`` (existing instances). The formats are those a real H100 printed
(tests/fixtures/nvidia_smi/h100_real) and NVIDIA's documentation shows for MIG-enabled GPUs.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field

from petals_chain.launch import mig_profiles
from petals_chain.launch.commands import CommandError, run

QUERY_FIELDS = "index,uuid,name,memory.total,mig.mode.current"
QUERY_ARGS = [f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader"]
_GPU_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)\s]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)\s*$")
_LGIP_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(?:Yes|No)\s")
_LGI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|")
_LCI_ROW = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)(?:\s+\d+:\d+)?\s+\|")
_CREATED_GI = re.compile(r"created GPU instance ID\s+(\d+) on GPU\s+(\d+) using profile MIG (\S+)")
_LGIPP_ROW = re.compile(r"^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}:(\d+)\s*$")
NO_MIG_DEVICES = "No MIG-enabled devices found."  # what ``nvidia-smi mig -lgi/-lci`` print where MIG is off


class MigError(RuntimeError):
    """MIG cannot be set up as asked (no such GPU, not MIG-capable, busy, nvidia-smi failed, read-back mismatch)."""


@dataclass(frozen=True)
class GpuInfo:
    """One row of ``--query-gpu``: index, UUID, product name, memory (MiB), MIG mode (None if not MIG-capable)."""

    index: int
    uuid: str
    name: str
    memory_mib: float
    mig_mode: str | None
    # read by probe_gpus from ``nvidia-smi mig -i N -lgip`` / ``-lgipp`` (None: not listed, e.g. older drivers)
    offered: dict[str, int] | None = field(default=None, compare=False)  # profile name -> profile ID
    placements: dict[int, tuple[tuple[int, ...], int]] | None = field(default=None, compare=False)  # ID -> starts, size

    @property
    def product(self) -> mig_profiles.GpuProduct | None:
        """The MIG product this GPU is (None for GPUs without MIG)."""
        return mig_profiles.product_for(self.name, self.memory_mib) if self.mig_mode else None


@dataclass(frozen=True)
class MigDevice:
    """A MIG device from ``nvidia-smi -L``: parent GPU, profile name, device number, ``MIG-...`` UUID."""

    gpu: int
    profile: str
    device: int
    uuid: str


@dataclass(frozen=True)
class ProfileRow:
    """A row of ``nvidia-smi mig -lgip``."""

    gpu: int
    name: str
    profile_id: int
    free: int
    total: int
    memory_gib: float


@dataclass(frozen=True)
class ProfilePlacements:
    """A line of ``nvidia-smi mig -lgipp``: GPU, profile ID, allowed memory-slice starts, slices taken."""

    gpu: int
    profile_id: int
    starts: tuple[int, ...]
    size: int


@dataclass(frozen=True)
class GpuInstance:
    """A row of ``nvidia-smi mig -lgi``: GPU, profile, profile ID, GPU-instance ID, placement start and size."""

    gpu: int
    name: str
    profile_id: int
    gi: int
    start: int
    size: int


@dataclass(frozen=True)
class ComputeInstance:
    """A row of ``nvidia-smi mig -lci``: GPU, parent GPU instance, profile, CI profile ID, CI ID."""

    gpu: int
    gi: int
    name: str
    profile_id: int
    ci: int


def parse_query_gpu(text: str) -> list[GpuInfo]:
    """Parse ``--query-gpu=index,uuid,name,memory.total,mig.mode.current --format=csv,noheader``."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            raise MigError(f"nvidia-smi --query-gpu line {lineno}: expected 5 fields '{QUERY_FIELDS}', got {line!r}")
        mem = re.match(r"^([\d.]+)\s*MiB$", cells[3])
        mode = cells[4] if cells[4] in ("Enabled", "Disabled") else None
        out.append(GpuInfo(int(cells[0]), cells[1], cells[2], float(mem.group(1)) if mem else 0.0, mode))
    return out


def parse_list(text: str) -> tuple[dict[int, tuple[str, str]], list[MigDevice]]:
    """Parse ``nvidia-smi -L``: {gpu index: (name, GPU UUID)} and the MIG devices under each GPU, in order."""
    gpus: dict[int, tuple[str, str]] = {}
    devices: list[MigDevice] = []
    current = None
    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            current = int(m.group(1))
            gpus[current] = (m.group(2), m.group(3))
        elif (m := _MIG_LINE.match(line)) and current is not None:
            devices.append(MigDevice(current, m.group(1), int(m.group(2)), m.group(3)))
    return gpus, devices


def parse_lgip(text: str) -> list[ProfileRow]:
    """Parse the profile rows of ``nvidia-smi mig -lgip`` (continuation lines are ignored)."""
    return [ProfileRow(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                       float(m.group(6))) for line in text.splitlines() if (m := _LGIP_ROW.match(line))]


def parse_lgipp(text: str) -> list[ProfilePlacements]:
    """Parse ``nvidia-smi mig -lgipp`` (``GPU  0 Profile ID  9 Placements: {0,4}:4``; one start: ``Placement :``)."""
    return [ProfilePlacements(int(m.group(1)), int(m.group(2)),
                              tuple(int(x) for x in m.group(3).replace(" ", "").split(",") if x), int(m.group(4)))
            for line in text.splitlines() if (m := _LGIPP_ROW.match(line.strip()))]


def mig_off(text: str) -> bool:
    """Whether an ``nvidia-smi mig`` listing says that no GPU has MIG enabled."""
    return NO_MIG_DEVICES.rstrip(".").lower() in text.lower()


def parse_lgi(text: str) -> list[GpuInstance]:
    """Parse ``nvidia-smi mig -lgi`` (an empty list when it says no instances exist)."""
    return [GpuInstance(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                        int(m.group(6))) for line in text.splitlines() if (m := _LGI_ROW.match(line))]


def parse_lci(text: str) -> list[ComputeInstance]:
    """Parse ``nvidia-smi mig -lci`` (an empty list when it says no instances exist)."""
    return [ComputeInstance(int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5)))
            for line in text.splitlines() if (m := _LCI_ROW.match(line))]


def parse_created(text: str) -> list[tuple[int, int, str]]:
    """(gpu, GPU-instance ID, profile) of each 'Successfully created GPU instance' line of ``-cgi``."""
    return [(int(m.group(2)), int(m.group(1)), m.group(3)) for m in _CREATED_GI.finditer(text)]


class NvidiaSmi:
    """Runs ``nvidia-smi`` (the one on PATH unless given) and returns its stdout; MigError on failure."""

    def __init__(self, executable: str | None = None) -> None:
        """Use ``executable``, else whatever ``nvidia-smi`` is on PATH (None: not installed)."""
        self.executable = executable or shutil.which("nvidia-smi")

    @property
    def present(self) -> bool:
        """Whether an nvidia-smi executable was found."""
        return self.executable is not None

    def __call__(self, args: list[str], *, check: bool = True) -> str:
        """Run ``nvidia-smi ARGS``; its output (stderr appended when it failed and ``check`` is off)."""
        if self.executable is None:
            raise MigError("nvidia-smi not found on PATH")
        try:
            proc = run([self.executable, *args], check=check, timeout_s=300)
        except CommandError as err:
            said = err.output.strip()
            raise MigError(f"nvidia-smi {' '.join(args)} failed (exit {err.returncode}): {said}") from None
        return proc.stdout + (proc.stderr if proc.returncode else "")
