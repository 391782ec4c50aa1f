"""MIG on real GPUs: read ``nvidia-smi``, plan the ``nvidia-smi mig`` commands, apply them when asked, read back UUIDs.

Reading: ``nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current
--format=csv,noheader`` (which GPUs, which product, MIG capable/enabled), ``nvidia-smi -L`` (GPU and
``MIG-...`` device UUIDs), ``nvidia-smi mig -lgip`` (profile IDs offered), ``-lgipp`` (their placements),
``-lgi`` / ``-lci`` (existing GPU / compute instances). On a real H100 (driver 580, MIG disabled) ``-lgip``
and ``-lgipp`` list the profiles although MIG is off, so the plan reads the real profile IDs and placements
before anything is changed; ``-lgi`` / ``-lci`` then print "No MIG-enabled devices found." (exit 0), which
reads as "no instances" (recordings: tests/fixtures/nvidia_smi/h100_real).
Plan per GPU: ``nvidia-smi -i N -mig 1`` if MIG is off, then ``nvidia-smi mig -i N -cgi ID:START,... -C``
(explicit placements, largest first, so the driver cannot pick a layout that leaves no room for the rest).
Teardown: ``nvidia-smi mig -i N -dci -gi G`` and ``-dgi -gi G`` for each instance we made, and
``nvidia-smi -i N -mig 0`` if we turned MIG on. A GPU that already has instances is refused (we never
destroy someone else's). Each server then runs with ``CUDA_VISIBLE_DEVICES=<MIG UUID>``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from petals_chain.launch import mig_profiles
from petals_chain.launch.commands import CommandError, run, show
from petals_chain.launch.testbed import Testbed

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


def probe_gpus(smi: NvidiaSmi) -> tuple[list[GpuInfo], str]:
    """The GPUs nvidia-smi reports, and why there are none ('' when some were found).

    For each MIG-capable GPU the profiles it offers and their placements are read too (``nvidia-smi mig -i N
    -lgip`` / ``-lgipp``, read-only; real drivers list them also while MIG is disabled). Where they are not
    listed (an older driver, or the listing failed) ``offered`` / ``placements`` stay None and the plan uses
    the documented profile IDs, re-read after MIG is enabled.
    """
    if not smi.present:
        return [], "nvidia-smi not found on PATH"
    try:
        gpus = parse_query_gpu(smi(QUERY_ARGS))
    except MigError as err:
        return [], str(err)
    return [_with_profiles(g, smi) if g.product else g for g in gpus], "" if gpus else "nvidia-smi lists no GPUs"


def _with_profiles(g: GpuInfo, smi: NvidiaSmi) -> GpuInfo:
    """``g`` with the profile IDs and placements its ``nvidia-smi mig -lgip`` / ``-lgipp`` list (if any)."""
    i = str(g.index)
    try:
        offered = {r.name: r.profile_id for r in parse_lgip(smi(["mig", "-i", i, "-lgip"], check=False))
                   if r.gpu == g.index}
        places = {p.profile_id: (p.starts, p.size) for p in parse_lgipp(smi(["mig", "-i", i, "-lgipp"], check=False))
                  if p.gpu == g.index}
    except MigError:
        return g
    return dataclasses.replace(g, offered=offered or None, placements=places or None)


def check_gpus(testbed: Testbed, gpus: list[GpuInfo]) -> list[str]:
    """Why the testbed's GPUs cannot be set up on these GPUs (empty list: they can)."""
    by_index = {g.index: g for g in gpus}
    problems = []
    for req in testbed.gpus:
        g = by_index.get(req.index)
        if g is None:
            problems.append(f"GPU {req.index} not found (nvidia-smi lists {sorted(by_index) or 'none'})")
        elif g.product is None:
            problems.append(f"GPU {req.index} ({g.name}, {g.memory_mib:.0f} MiB) is not MIG-capable "
                            f"(mig.mode.current is not Enabled/Disabled or the product is unknown)")
        elif g.product.key != req.product:
            problems.append(f"GPU {req.index} is a {g.product.key} ({g.name}); the testbed asks for {req.product}")
        else:
            problems += _check_offered(req.index, g, req.profiles)
    return problems


def _check_offered(index: int, g: GpuInfo, profiles: tuple[str, ...]) -> list[str]:
    """Disagreements between the GPU's own ``-lgip`` / ``-lgipp`` listing and the profile table for ``profiles``."""
    problems = []
    if g.offered is not None:
        missing = [p for p in dict.fromkeys(profiles) if p not in g.offered]
        if missing:
            problems.append(f"GPU {index} ({g.name}) does not offer MIG profile(s) {', '.join(missing)} "
                            f"(nvidia-smi mig -lgip lists {', '.join(g.offered)})")
    if g.placements is not None and g.product is not None:
        for name in dict.fromkeys(profiles):
            prof = g.product.profiles[name]
            pid = g.offered.get(name, prof.profile_id) if g.offered else prof.profile_id
            real = g.placements.get(pid)
            if real is not None and (real[0], real[1]) != (prof.starts, prof.memory_slices):
                problems.append(f"GPU {index}: nvidia-smi mig -lgipp places profile {name} (ID {pid}) at starts "
                                f"{set(real[0])} over {real[1]} slices; the table "
                                f"(petals_chain/launch/mig_profiles.py) says {set(prof.starts)} over "
                                f"{prof.memory_slices}")
    return problems


@dataclass(frozen=True)
class GpuPlan:
    """What to do on one GPU: enable MIG or not, and the GPU instances (profile ID + placement start) to create."""

    index: int
    product: str
    profiles: tuple[str, ...]
    starts: tuple[int, ...]
    profile_ids: tuple[int, ...]
    enable_mig: bool
    ids_read: bool = False  # profile IDs read from the GPU's own ``nvidia-smi mig -lgip`` (else the documented ones)

    def create_spec(self) -> str:
        """The ``-cgi`` argument: ``ID:START`` tuples, largest profiles first."""
        order = sorted(range(len(self.profiles)), key=lambda k: (-self.sizes[k], self.starts[k]))
        return ",".join(f"{self.profile_ids[k]}:{self.starts[k]}" for k in order)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Memory slices of each profile."""
        prod = mig_profiles.PRODUCTS[self.product]
        return tuple(prod.profiles[p].memory_slices for p in self.profiles)


@dataclass(frozen=True)
class MigPlan:
    """The MIG commands for a testbed; ``detected`` says whether they were checked against real GPUs."""

    gpus: tuple[GpuPlan, ...]
    detected: bool

    def setup_commands(self) -> list[list[str]]:
        """Enable MIG where needed, then create the GPU instances with their default compute instances."""
        cmds = []
        for g in self.gpus:
            if g.enable_mig:
                cmds.append(["nvidia-smi", "-i", str(g.index), "-mig", "1"])
            cmds.append(["nvidia-smi", "mig", "-i", str(g.index), "-cgi", g.create_spec(), "-C"])
        return cmds

    def teardown_commands(self, created: dict[int, list[int]] | None = None) -> list[list[str]]:
        """Destroy the compute then GPU instances (those in ``created``, else all on the GPU), disable MIG if we did."""
        cmds = []
        for g in self.gpus:
            cmds += _teardown_gpu(g.index, (created or {}).get(g.index, []), g.enable_mig)
        return cmds


def _teardown_gpu(index: int, gis: list[int], disable_mig: bool) -> list[list[str]]:
    """Teardown commands for one GPU: per GI ``-dci -gi G`` then ``-dgi -gi G`` (all when no IDs), then -mig 0."""
    i = str(index)
    if gis:
        cmds = [["nvidia-smi", "mig", "-i", i, "-dci", "-gi", str(g)] for g in gis]
        cmds += [["nvidia-smi", "mig", "-i", i, "-dgi", "-gi", str(g)] for g in gis]
    else:
        cmds = [["nvidia-smi", "mig", "-i", i, "-dci"], ["nvidia-smi", "mig", "-i", i, "-dgi"]]
    if disable_mig:
        cmds.append(["nvidia-smi", "-i", i, "-mig", "0"])
    return cmds


def plan_mig(testbed: Testbed, gpus: list[GpuInfo] | None = None) -> MigPlan:
    """The plan from the testbed alone (``gpus`` None: MIG assumed off, documented profile IDs) or checked on GPUs."""
    if gpus is not None:
        problems = check_gpus(testbed, gpus)
        if problems:
            raise MigError("; ".join(problems))
    by_index = {g.index: g for g in gpus or []}
    plans = []
    for req in testbed.gpus:
        prod = mig_profiles.PRODUCTS[req.product]
        enable = True if gpus is None else by_index[req.index].mig_mode != "Enabled"
        offered = by_index[req.index].offered if gpus is not None else None
        ids = tuple((offered or {}).get(p, prod.profiles[p].profile_id) for p in req.profiles)
        plans.append(GpuPlan(req.index, req.product, req.profiles, req.placements, ids, enable, bool(offered)))
    return MigPlan(tuple(plans), gpus is not None)


def format_plan(plan: MigPlan) -> str:
    """The MIG plan as shell lines, setup then teardown."""
    lines = []
    for g in plan.gpus:
        ids = "read from its nvidia-smi mig -lgip" if g.ids_read else "documented, re-read once MIG is on"
        state = ("MIG is off: setup enables it (root, no process on the GPU; a driver that reports the mode as "
                 "pending needs a GPU reset first)" if g.enable_mig else "MIG is on")
        lines.append(f"GPU {g.index} ({g.product}): {state}; profile IDs {ids}")
    lines += ["MIG setup:"] + [f"  {show(c)}" for c in plan.setup_commands()]
    lines += ["MIG teardown:"] + [f"  {show(c)}" for c in plan.teardown_commands()]
    return "\n".join(lines)


def apply_gpu(g: GpuPlan, smi: NvidiaSmi, on_enabled: Callable[[], None],
              on_created: Callable[[list[int]], None]) -> list[int]:
    """Run one GPU's setup: enable MIG (if planned), check it is free, create the instances; their GI IDs.

    ``on_enabled()`` / ``on_created(gis)`` let the caller record each step for teardown as it happens.
    Profile IDs are re-read from ``nvidia-smi mig -lgip`` so a driver numbering them differently still works.
    """
    i = str(g.index)
    if g.enable_mig:
        on_enabled()
        said = smi(["-i", i, "-mig", "1"])
        if "pending" in said.lower():
            raise MigError(f"GPU {g.index}: MIG mode is pending, not enabled (the GPU is in use or needs a reset): "
                           f"{said.strip()}")
    existing = [x for x in parse_lgi(smi(["mig", "-i", i, "-lgi"], check=False)) if x.gpu == g.index]
    if existing:
        raise MigError(f"GPU {g.index} already has MIG GPU instance(s) {sorted(x.gi for x in existing)}: "
                       "remove them first (we only destroy instances we created)")
    listing = smi(["mig", "-i", i, "-lgip"])
    offered = {r.name: r.profile_id for r in parse_lgip(listing) if r.gpu == g.index}
    if not offered:
        raise MigError(f"GPU {g.index}: nvidia-smi mig -lgip lists no MIG profiles "
                       f"({listing.strip() or 'no output'}): MIG is not enabled there (a mode change the driver "
                       "reports as pending needs a GPU reset first)")
    missing = [p for p in g.profiles if p not in offered]
    if missing:
        raise MigError(f"GPU {g.index} does not offer MIG profile(s) {', '.join(missing)} (nvidia-smi mig -lgip)")
    real = GpuPlan(g.index, g.product, g.profiles, g.starts, tuple(offered[p] for p in g.profiles), g.enable_mig,
                   True)
    said = smi(["mig", "-i", i, "-cgi", real.create_spec(), "-C"])
    gis = [gi for gpu, gi, _ in parse_created(said) if gpu == g.index]
    on_created(gis)
    if len(gis) != len(g.profiles):
        raise MigError(f"GPU {g.index}: asked for {len(g.profiles)} GPU instances, nvidia-smi created {len(gis)}: "
                       f"{said.strip()}")
    return gis


def read_back(testbed: Testbed, smi: NvidiaSmi) -> dict[str, str]:
    """Each server's ``MIG-...`` UUID, from ``nvidia-smi -L`` and ``-lgi`` after setup.

    Within one GPU, servers of the same profile are interchangeable; they get that profile's
    devices in the order nvidia-smi lists them. Raises MigError if any planned instance is missing.
    """
    instances = parse_lgi(smi(["mig", "-lgi"], check=False))
    _, devices = parse_list(smi(["-L"]))
    by_key: dict[tuple[int, str], list[MigDevice]] = defaultdict(list)
    for d in devices:
        by_key[(d.gpu, d.profile)].append(d)
    uuids = {}
    for srv in testbed.servers:
        placed = [x for x in instances if x.gpu == srv.gpu_index and x.name == srv.profile and x.start == srv.placement]
        if not placed:
            raise MigError(f"server {srv.name}: no {srv.profile} GPU instance at slice {srv.placement} on GPU "
                           f"{srv.gpu_index} (nvidia-smi mig -lgi)")
        pool = by_key.get((srv.gpu_index, srv.profile), [])
        if not pool:
            raise MigError(f"server {srv.name}: nvidia-smi -L lists no (more) {srv.profile} devices on GPU "
                           f"{srv.gpu_index}")
        uuids[srv.name] = pool.pop(0).uuid
    return uuids


def teardown_entries(entries: list[dict], smi: NvidiaSmi | None = None) -> list[str]:
    """Undo recorded MIG steps (``{"gpu", "gis", "enabled_mig"}``); the problems that remain (empty: clean)."""
    smi = smi or NvidiaSmi()
    problems = []
    for e in entries:
        for cmd in _teardown_gpu(int(e["gpu"]), [int(x) for x in e.get("gis", [])], bool(e.get("enabled_mig"))):
            try:
                smi(cmd[1:])
            except MigError as err:
                if "not found" not in str(err).lower():
                    problems.append(str(err))
    return problems
