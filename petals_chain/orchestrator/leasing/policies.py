"""The one registry of live lease policies: every name the CLI, the config file and the API accept, with what each
policy can do, declared once (Ray Serve's registry of request-router classes is the model).

A policy has a *role*, the decision it makes:

- ``routing``: how a request reaches servers: leases on the composed chains (``jffc``, one central queue) or a route
  per request over the placement (``ws_rr``); the names are :class:`~petals_chain.compose.method_table.Routing`'s
  orchestrated values, and a method's routing picks the lease manager
  (:func:`petals_chain.orchestrator.leasing.managers.lease_manager`);
- ``dispatch``: which offered chain a waiting request starts on (JFFC, or TORTA's greedy score within a region:
  ``--micro``);
- ``migration``: whether and how running sessions move between chains (``--migration``, ``POST /migrations``): none,
  JFFC with migration, or a Mell packer that places every session and consolidates (``worst-fit`` packs without
  moving: Mell's baseline).

Every list of names (argparse choices, the config's check, the API's 400, ``GET /policies``) is read from
:data:`LEASE_POLICIES`; an unknown name is refused with one line naming the field and the choices.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from petals_chain.compose.method_table import Routing
from petals_chain.mell.live import packing_policy
from petals_chain.model import SpecError
from petals_chain.orchestrator.leasing.policy import JFFC_POLICY, LeaseCapabilities, LeasePolicy
from petals_chain.torta.live import GreedyScorePolicy

ROLES = ("routing", "dispatch", "migration")


@dataclass(frozen=True)
class LivePolicy:
    """One live policy: its name in its role, a line on what it does, what it can do, and its chain decision."""

    role: str
    name: str
    summary: str
    capabilities: LeaseCapabilities = field(default_factory=LeaseCapabilities)
    chains: LeasePolicy | None = None
    """The decision over the offered chains (dispatch; a packer's migration policy), None where the manager's own
    JFFC decides (routing; migration ``none`` and ``jffc``)."""

    def to_json(self) -> dict[str, Any]:
        """As ``GET /policies`` lists it."""
        caps = self.capabilities
        return {"role": self.role, "name": self.name, "summary": self.summary,
                "capabilities": {"routes_over_placement": caps.routes_over_placement,
                                 "moves_sessions": caps.moves_sessions, "fixed_chains": caps.fixed_chains,
                                 "packs": caps.packs}}


class PolicyRegistry:
    """Live policies by role and name."""

    def __init__(self, policies: Iterable[LivePolicy]) -> None:
        self._by_role: dict[str, dict[str, LivePolicy]] = {role: {} for role in ROLES}
        for p in policies:
            if p.role not in self._by_role:
                raise ValueError(f"lease policy {p.name!r}: role must be one of {ROLES}, got {p.role!r}")
            if p.name in self._by_role[p.role]:
                raise ValueError(f"lease policy {p.name!r} registered twice for role {p.role!r}")
            self._by_role[p.role][p.name] = p

    def names(self, role: str) -> tuple[str, ...]:
        """The names a role accepts, in registration order."""
        return tuple(self._by_role[role])

    def get(self, role: str, name: str, *, field_name: str | None = None) -> LivePolicy:
        """The policy ``name`` of ``role``; a one-line SpecError naming the field (default: the role) and the
        choices if there is none."""
        try:
            return self._by_role[role][name]
        except (KeyError, TypeError):
            choices = ", ".join(self.names(role))
            raise SpecError(f"field '{field_name or role}' must be one of {choices}, got {name!r}") from None

    def to_json(self) -> list[dict[str, Any]]:
        """Every policy, role by role."""
        return [p.to_json() for role in ROLES for p in self._by_role[role].values()]


LEASE_POLICIES = PolicyRegistry([
    LivePolicy("routing", Routing.JFFC.value, "leases on the composed chains from one central FIFO queue (JFFC); "
               "sessions may move (--migration) and servers be drained",
               LeaseCapabilities(moves_sessions=True)),
    LivePolicy("routing", Routing.WS_RR.value, "a WS-RR route per request over the placement, no fixed chains",
               LeaseCapabilities(routes_over_placement=True, fixed_chains=False)),
    LivePolicy("dispatch", "jffc", "the fastest offered chain with a free slot", chains=JFFC_POLICY),
    LivePolicy("dispatch", "greedy", "TORTA's greedy score over the region's chains", chains=GreedyScorePolicy()),
    LivePolicy("migration", "none", "sessions stay on the chain they started on (JFFC)"),
    LivePolicy("migration", "jffc", "JFFC with migration: a freed fast slot takes the longest-resident session of "
               "the slowest busy chain", LeaseCapabilities(moves_sessions=True)),
    LivePolicy("migration", "mell", "Mell's packer places every session and consolidates with bounded moves",
               LeaseCapabilities(moves_sessions=True, packs=True), chains=packing_policy("mell")),
    LivePolicy("migration", "worst-fit", "worst-fit packing without moves (Mell's baseline)",
               LeaseCapabilities(packs=True), chains=packing_policy("worst-fit")),
])
