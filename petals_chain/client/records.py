"""What a leased inference session records: its lease, chain and route, its waits, each failover and each move."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FailoverRecord:
    """One recovery of a leased session: which server failed, what the client did about it, and when.

    ``action``: 'reported' (the server is gone: the orchestrator marked it dead and gave a replacement lease),
    'moved' (a recomposition retired the chain: a new lease), 'reloading' (the server was loading its span:
    waited, same lease), 'refused' (it answered with an error on a stable chain: retried once, same lease).
    """

    server: str
    action: str
    cause: str
    from_lease: str
    from_chain: str
    to_lease: str | None = None
    to_chain: str | None = None
    replayed_tokens: int = 0
    queue_waited_s: float = 0.0  # of the recovery: time the new lease waited for a free slot (orchestrator's view)
    step_started_s: float = 0.0  # time.monotonic() when the step that failed began
    detected_s: float = 0.0  # when petals gave the failure back
    recovered_s: float | None = None  # when that step completed on the new route

    @property
    def recovery_s(self) -> float | None:
        """Failure seen → step completed on the new route (report, new lease, replay)."""
        return None if self.recovered_s is None else self.recovered_s - self.detected_s


@dataclass
class MigrationRecord:
    """One move of a leased session to another chain at a step boundary (docs/migration.md): from which lease and
    chain to which, in which mode, how many tokens it carried, how long the step it delayed waited, and why not."""

    from_lease: str
    from_chain: str
    to_lease: str
    to_chain: str
    mode: str
    tokens: int
    started_s: float  # time.monotonic() when the move began (a step boundary)
    done_s: float | None = None  # when the session ran on the new chain (None: it failed)
    error: str | None = None  # why it failed; the session then stayed on its old chain

    @property
    def downtime_s(self) -> float | None:
        """The extra gap the move put before the next step."""
        return None if self.done_s is None else self.done_s - self.started_s


@dataclass
class SessionRecord:
    """What one leased session did: its chain, how long it waited for a slot and how long it was served."""

    client: str | None
    requested_s: float  # time.monotonic() when the session asked for a lease
    lease_id: str | None = None
    chain_id: str | None = None
    version: int | None = None
    spans: tuple[tuple[str, int, int], ...] = ()
    waited_s: float | None = None  # request → lease granted, as the client saw it
    queue_waited_s: float | None = None  # time in the orchestrator's queue, as the orchestrator saw it
    service_s: float | None = None  # lease granted → session closed
    error: str | None = None
    failovers: list[FailoverRecord] = field(default_factory=list)  # lease/chain/spans above: the last lease
    migrations: list[MigrationRecord] = field(default_factory=list)

    @property
    def response_s(self) -> float | None:
        """Waiting + service."""
        if self.waited_s is None or self.service_s is None:
            return None
        return self.waited_s + self.service_s

    def route(self) -> str:
        """'s1[0:15] -> s2[15:30]'."""
        return " -> ".join(f"{s}[{a}:{b}]" for s, a, b in self.spans)
