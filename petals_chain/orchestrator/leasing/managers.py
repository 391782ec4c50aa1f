"""The lease manager a method's routing calls for, built from the registry's declared capabilities.

A routing policy that ``routes_over_placement`` gets :class:`~petals_chain.orchestrator.leasing.ws_rr.WsRrLeaseManager`
(no fixed chains, so no migration policy but ``none``); one that leases the composed chains gets
:class:`~petals_chain.orchestrator.leasing.migration.MigratingLeaseManager` with the migration policy asked for, or a
plain :class:`~petals_chain.orchestrator.leasing.leases.LeaseManager` deciding by another dispatch policy (a region's
``--micro``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from petals_chain.model import SpecError
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES
from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager


def lease_manager(routing: str, migration: str = "none") -> Callable[..., LeaseManager]:
    """The factory (keywords ``default_ttl_s``, ``max_waiting``, ``clock``) of the lease manager for ``routing``
    with ``migration``; SpecError naming the field for an unknown name or a migration the routing cannot do."""
    route = LEASE_POLICIES.get("routing", routing)
    LEASE_POLICIES.get("migration", migration)
    if route.capabilities.routes_over_placement:
        if migration != "none":
            raise SpecError(f"--migration {migration} needs leases on fixed chains; routing {routing!r} routes each "
                            "request over the placement")
        return WsRrLeaseManager
    return functools.partial(MigratingLeaseManager, migration=migration)


def dispatch_manager(dispatch: str) -> Callable[..., LeaseManager]:
    """The factory of a lease manager whose chain decision is the registry's ``dispatch`` policy (``--micro``)."""
    return functools.partial(LeaseManager, policy=LEASE_POLICIES.get("dispatch", dispatch, field_name="micro").chains)
