"""MIG on real GPUs: plan the ``nvidia-smi mig`` commands for a testbed, apply them when asked, read back UUIDs.

What the GPUs offer is read by :mod:`petals_chain.launch.mig_smi`. On a real H100 (driver 580, MIG disabled)
``mig -lgip`` / ``-lgipp`` list the profiles although MIG is off, so the plan uses the real profile IDs and
placements before anything is changed; ``-lgi`` / ``-lci`` then print "No MIG-enabled devices found." (exit 0),
which reads as "no instances". Plan per GPU: ``nvidia-smi -i N -mig 1`` if MIG is off, then
``nvidia-smi mig -i N -cgi ID:START,... -C`` (explicit placements, largest first, so the driver cannot pick a
layout that leaves no room for the rest). Teardown: ``nvidia-smi mig -i N -dci -gi G`` and ``-dgi -gi G`` for
each instance we made, and ``nvidia-smi -i N -mig 0`` if we turned MIG on. A GPU that already has instances is
refused (we never destroy someone else's). Each server then runs with ``CUDA_VISIBLE_DEVICES=<MIG UUID>``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from petals_chain.launch import mig_profiles
from petals_chain.launch.commands import show
from petals_chain.launch.mig_smi import (
    QUERY_ARGS,
    GpuInfo,
    MigDevice,
    MigError,
    NvidiaSmi,
    parse_created,
    parse_lgi,
    parse_lgip,
    parse_lgipp,
    parse_list,
    parse_query_gpu,
)
from petals_chain.launch.testbed import Testbed

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
