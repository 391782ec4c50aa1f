"""Dispatch policies behind one protocol (``base.DispatchPolicy``) and a factory that builds them by name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import DispatchPolicy, Start, check_chains
from petals_chain.dispatch.jffc import JFFC
from petals_chain.dispatch.jffc_migration import JFFCMigration
from petals_chain.dispatch.jiq import JIQ
from petals_chain.dispatch.jsq import JSQ, SAJSQ
from petals_chain.dispatch.sed import SED

POLICY_NAMES: tuple[str, ...] = ("JFFC", "JSQ", "SA-JSQ", "SED", "JIQ", "JFFC-migration")


def canonical_name(name: str) -> str:
    """The canonical spelling of a policy name (case, '_' and '-' are ignored); ValueError if unknown."""
    wanted = name.replace("_", "").replace("-", "").lower()
    for canon in POLICY_NAMES:
        if canon.replace("-", "").lower() == wanted:
            return canon
    raise ValueError(f"unknown dispatch policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def make_policy(
    name: str, rates: Sequence[float], capacities: Sequence[int], rng: np.random.Generator | None = None
) -> DispatchPolicy:
    """Build the policy ``name`` for chains with service rates μ_k and capacities c_k.

    ``rng`` is required by the randomised policies (JSQ, SA-JSQ, SED, JIQ draw
    one uniform per arrival); JFFC and JFFC-migration are deterministic.
    """
    canon = canonical_name(name)
    if canon == "JFFC":
        return JFFC(rates, capacities)
    if canon == "JFFC-migration":
        return JFFCMigration(rates, capacities)
    if rng is None:
        raise ValueError(f"dispatch policy {canon} breaks ties at random: pass rng=numpy.random.default_rng(seed)")
    classes = {"JSQ": JSQ, "SA-JSQ": SAJSQ, "SED": SED, "JIQ": JIQ}
    return classes[canon](rates, capacities, rng)


__all__ = [
    "JFFC",
    "JIQ",
    "JSQ",
    "POLICY_NAMES",
    "SAJSQ",
    "SED",
    "DispatchPolicy",
    "JFFCMigration",
    "Start",
    "canonical_name",
    "check_chains",
    "make_policy",
]
