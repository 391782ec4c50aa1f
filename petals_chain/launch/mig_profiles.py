"""MIG GPU-instance profiles per GPU product, and the placement check that says whether a set of profiles fits one GPU.

Source: NVIDIA's MIG user guide ("Supported MIG Profiles", and the ``nvidia-smi mig -lgip`` /
``-lgipp`` transcripts it shows). A MIG GPU has 7 compute slices and 8 memory slices; a
GPU-instance profile takes ``compute_slices`` of the first and a contiguous run of
``memory_slices`` of the second, starting only at the offsets ``nvidia-smi mig -lgipp`` lists
(A100/H100/H200 all share one geometry)::

    profile ID 19 (1g, 1 memory slice)   starts {0,1,2,3,4,5,6}   at most 7
    profile ID 20 (1g+me)                starts {0,...,6}          at most 1
    profile ID 15 (1g, 2 memory slices)  starts {0,2,4,6}          at most 4
    profile ID 14 (2g)                   starts {0,2,4}            at most 3
    profile ID  9 (3g)                   starts {0,4}              at most 2
    profile ID  5 (4g)                   starts {0}                at most 1
    profile ID  0 (7g)                   starts {0} (8 slices)     at most 1

The names carry the memory of the product: A100-40GB 1g.5gb / 1g.10gb / 2g.10gb / 3g.20gb /
4g.20gb / 7g.40gb; A100-80GB and H100-80GB 1g.10gb / 1g.20gb / 2g.20gb / 3g.40gb / 4g.40gb /
7g.80gb; H100-94GB (NVL) 1g.12gb / 1g.24gb / 2g.24gb / 3g.47gb / 4g.47gb / 7g.94gb; H200-141GB
1g.18gb / 1g.35gb / 2g.35gb / 3g.71gb / 4g.71gb / 7g.141gb (each 1g profile also with ``+me``).
The profile IDs are the ones the documented transcripts show; the launcher re-reads them from
``nvidia-smi mig -lgip`` on the real GPU before creating anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


class MigProfileError(ValueError):
    """A MIG profile is unknown for the GPU product, or a set of profiles does not fit one GPU."""


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: its name (``3g.40gb``), nvidia-smi profile ID, slices, allowed starts, max count."""

    name: str
    profile_id: int
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    max_instances: int

    @property
    def memory_bytes(self) -> float:
        """The memory the name advertises (``3g.40gb`` → 40e9 bytes): what a server on it may budget."""
        return float(self.name.split(".")[1].removesuffix("+me").removesuffix("gb")) * 1e9


@dataclass(frozen=True)
class GpuProduct:
    """A MIG-capable GPU product: the key testbed files use, how nvidia-smi names it, and its profiles."""

    key: str
    name_markers: tuple[str, ...]
    min_memory_mib: int
    max_memory_mib: int
    profiles: dict[str, MigProfile]


# (size suffix per 1g.small, 1g.large, 2g, 3g, 4g, 7g) per product; the geometry below is shared.
_GEOMETRY = (
    # name template, ID, compute slices, memory slices, starts, max instances
    ("1g.{a}", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    ("1g.{a}+me", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.{b}", 15, 1, 2, (0, 2, 4, 6), 4),
    ("2g.{b}", 14, 2, 2, (0, 2, 4), 3),
    ("3g.{c}", 9, 3, 4, (0, 4), 2),
    ("4g.{c}", 5, 4, 4, (0,), 1),
    ("7g.{d}", 0, 7, 8, (0,), 1),
)


def _profiles(a: str, b: str, c: str, d: str) -> dict[str, MigProfile]:
    """Build one product's profile table from its four memory sizes (1-slice, 2-slice, 4-slice, 8-slice)."""
    out = {}
    for template, pid, cs, ms, starts, most in _GEOMETRY:
        name = template.format(a=a, b=b, c=c, d=d)
        out[name] = MigProfile(name, pid, cs, ms, starts, most)
    return out


PRODUCTS: dict[str, GpuProduct] = {
    p.key: p
    for p in (
        GpuProduct("A100-40GB", ("A100",), 30_000, 50_000, _profiles("5gb", "10gb", "20gb", "40gb")),
        GpuProduct("A100-80GB", ("A100",), 70_000, 90_000, _profiles("10gb", "20gb", "40gb", "80gb")),
        GpuProduct("H100-80GB", ("H100", "H800"), 70_000, 90_000, _profiles("10gb", "20gb", "40gb", "80gb")),
        GpuProduct("H100-94GB", ("H100", "H800"), 90_000, 100_000, _profiles("12gb", "24gb", "47gb", "94gb")),
        GpuProduct("H200-141GB", ("H200",), 130_000, 150_000, _profiles("18gb", "35gb", "71gb", "141gb")),
    )
}


def product(key: str) -> GpuProduct:
    """The product for a testbed ``type`` key; MigProfileError listing the known keys otherwise."""
    try:
        return PRODUCTS[key]
    except KeyError:
        raise MigProfileError(f"unknown GPU type {key!r} (known: {', '.join(PRODUCTS)})") from None


def product_for(name: str, memory_mib: float) -> GpuProduct | None:
    """The product nvidia-smi's ``name`` and ``memory.total`` (MiB) describe, or None for a non-MIG GPU."""
    for p in PRODUCTS.values():
        if any(m in name for m in p.name_markers) and p.min_memory_mib <= memory_mib < p.max_memory_mib:
            return p
    return None


def profile(prod: GpuProduct, name: str) -> MigProfile:
    """Look a profile up by name (``3g.40gb``, also accepted as ``MIG 3g.40gb``); error listing the valid ones."""
    key = name.removeprefix("MIG ").strip()
    try:
        return prod.profiles[key]
    except KeyError:
        raise MigProfileError(
            f"unknown MIG profile {name!r} for {prod.key} (known: {', '.join(prod.profiles)})") from None


def place(prod: GpuProduct, names: Sequence[str]) -> tuple[int, ...]:
    """Memory-slice start of each requested profile on one GPU (same order), or MigProfileError saying why not.

    Checks, in order: known names, per-profile instance limits, the 7 compute slices, then a
    non-overlapping placement on the 8 memory slices at allowed starts (exhaustive search:
    at most 7 instances, so it is tiny). Larger profiles are placed first, as NVIDIA advises.
    """
    profs = [profile(prod, n) for n in names]
    if not profs:
        raise MigProfileError("no MIG profiles requested for this GPU")
    for name, count in Counter(p.name for p in profs).items():
        most = prod.profiles[name].max_instances
        if count > most:
            raise MigProfileError(f"{count} × {name} exceed the {prod.key} limit of {most} instance(s) of that profile")
    me = sum(1 for p in profs if p.name.endswith("+me"))
    if me > 1:
        raise MigProfileError(f"{me} '+me' profiles requested; a {prod.key} has one set of media engines")
    compute = sum(p.compute_slices for p in profs)
    if compute > COMPUTE_SLICES:
        raise MigProfileError(
            f"profiles {', '.join(names)} need {compute} compute slices; a {prod.key} has {COMPUTE_SLICES}")
    order = sorted(range(len(profs)), key=lambda i: (-profs[i].memory_slices, -profs[i].compute_slices, i))
    starts: dict[int, int] = {}
    used = [False] * MEMORY_SLICES

    def search(k: int) -> bool:
        """Place profiles order[k:] on the free slices (backtracking)."""
        if k == len(order):
            return True
        i = order[k]
        p = profs[i]
        for s in p.starts:
            span = range(s, s + p.memory_slices)
            if span.stop <= MEMORY_SLICES and not any(used[x] for x in span):
                for x in span:
                    used[x] = True
                starts[i] = s
                if search(k + 1):
                    return True
                for x in span:
                    used[x] = False
        return False

    if not search(0):
        raise MigProfileError(
            f"profiles {', '.join(names)} have no non-overlapping placement on the {MEMORY_SLICES} memory slices "
            f"of a {prod.key} (they need {sum(p.memory_slices for p in profs)} slices at fixed offsets)")
    return tuple(starts[i] for i in range(len(profs)))
