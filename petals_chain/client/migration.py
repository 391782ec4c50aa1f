"""Moving a live leased session to another chain: the ``Migrator`` interface, its two modes, and the choice of mode.

A migrator makes a session's server state live on a new chain at the same position, or raises and leaves the
session exactly as it was on its old chain (whose server sessions stay open until the move has succeeded). Token
replay re-sends every input the session has stepped (its prompt and generated tokens) through fresh server sessions
of the new chain; KV transfer has each new server pull the cache of its blocks from the old ones
(:func:`petals_chain.client.kv_migrate.open_at`, the same path as ``kv_migrate.migrate``). The mode of a move is the
adaptive division of :func:`petals_chain.mell.hybrid.hybrid_divide` over this one move, deterministic, so every
caller with the same budgets and speeds picks the same. docs/migration.md, "Modes".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from petals.client.inference_session import InferenceSession

from petals_chain.client import kv_migrate
from petals_chain.client.kv_migrate import MigrationError
from petals_chain.mell.hybrid import Budgets, Mode, Speeds, hybrid_divide
from petals_chain.mell.state import Move
from petals_chain.protocol.replies import LeaseInfo

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SOURCE_LINK = "move"  # the one link a single move is charged to


__all__ = ["MIGRATORS", "KvTransfer", "MigrationError", "Migrator", "Switch", "TokenReplay", "choose_mode",
           "kv_bytes_per_token", "migrator_for"]


class MovableSession(Protocol):
    """What a migrator reads and swaps on a leased session (client/session.py's ``LeasedInferenceSession``; this
    module does not import it): PETALS' position, sequence manager and server sessions, the manager it was opened
    with, and every input it stepped."""

    _position: int
    _sequence_manager: Any
    _server_sessions: list[Any]
    _base_manager: Any

    @property
    def history(self) -> torch.Tensor | None:
        """Every input stepped so far (replayed on the new chain)."""

    def _exit_server_sessions(self, server_sessions: list[Any]) -> None:
        """Close server sessions (PETALS' own)."""


@dataclass
class Switch:
    """A session switched to a new chain whose old chain's state is still there: ``commit`` frees the old state once
    the orchestrator took the move, ``rollback`` puts the session back on its old chain and frees the new state."""

    session: MovableSession
    old_sessions: list[Any]
    old_manager: Any
    old_position: int

    def commit(self) -> None:
        """The move stands: close the old chain's server sessions (their caches are freed now)."""
        self.session._exit_server_sessions(self.old_sessions)
        self.old_sessions = []

    def rollback(self) -> None:
        """The move is off: back to the old chain's server sessions, the new ones closed."""
        s = self.session
        new = s._server_sessions
        s._server_sessions, s._sequence_manager, s._position = self.old_sessions, self.old_manager, self.old_position
        s._exit_server_sessions(new)
        self.old_sessions = []


class Migrator(Protocol):
    """Builds a session's server state on the chain of ``lease`` at the same position and switches the session to
    it, keeping the old chain's state until the returned :class:`Switch` is committed or rolled back; or raises
    :class:`MigrationError`, leaving the session on its old chain unchanged."""

    mode: Mode

    def migrate(self, session: MovableSession, lease: LeaseInfo) -> Switch:
        """Carry out the move; afterwards the session's server sessions run along ``lease``."""
        ...


class TokenReplay:
    """Re-prefill on the new chain: every input stepped so far goes through fresh server sessions there."""

    mode = Mode.TOKEN

    def migrate(self, session: MovableSession, lease: LeaseInfo) -> Switch:
        """Open the new chain's server sessions by replaying the history; the old ones stay open."""
        history = session.history
        switch = Switch(session, session._server_sessions, session._sequence_manager, session._position)
        session._server_sessions = []
        session._sequence_manager = session._base_manager.with_lease(lease)
        session._position = 0
        try:
            if history is not None and history.shape[1] > 0:
                InferenceSession.step(session, history)
        except Exception as exc:
            switch.rollback()
            raise MigrationError(f"token replay onto chain {lease.chain_id} failed: {exc!r}") from exc
        if session._position != switch.old_position:  # cannot happen: the replay is the history; never diverge
            got = session._position
            switch.rollback()
            raise MigrationError(f"replay reached position {got}, not {switch.old_position}")
        return switch


class KvTransfer:
    """KV transfer: each server of the new chain pulls the cache of its blocks from the old chain's servers, which
    keep theirs (and serve the session) until the switch is committed."""

    mode = Mode.KV

    def migrate(self, session: MovableSession, lease: LeaseInfo) -> Switch:
        """Open the new chain's server sessions holding the session's cache at its position; the old ones stay."""
        switch = Switch(session, session._server_sessions, session._sequence_manager, session._position)
        manager = session._base_manager.with_lease(lease)
        session._sequence_manager = manager  # the new sessions' metadata and routing are the new lease's
        try:
            new = kv_migrate.open_at(session, manager.make_sequence(mode="min_latency"), "kv")
        except Exception as exc:
            session._sequence_manager = switch.old_manager
            if isinstance(exc, MigrationError):
                raise
            raise MigrationError(f"KV transfer onto chain {lease.chain_id} failed: {exc!r}") from exc
        session._server_sessions = new
        return switch


MIGRATORS: dict[Mode, Migrator] = {Mode.TOKEN: TokenReplay(), Mode.KV: KvTransfer()}


def choose_mode(tokens: int, kv_bytes_per_token: int, link_bytes: float, prefill_tokens: int,
                rule: str = "fastest", speeds: Speeds | None = None) -> Mode:
    """The mode of one move of ``tokens`` cached tokens by the adaptive division within the per-move budgets of
    the link (bytes) and the new chain (prefill tokens): by default the faster feasible mode under ``speeds``
    (:class:`~petals_chain.mell.hybrid.Speeds`' defaults when None); ``rule='first'`` tries KV first; deferred when
    neither fits."""
    budgets = Budgets({SOURCE_LINK: float(link_bytes)}, {1: int(prefill_tokens)})
    division = hybrid_divide([Move(0, 0, 1, int(tokens))], max(1, int(kv_bytes_per_token)), budgets,
                             lambda src, dst: (SOURCE_LINK,), rule, speeds or Speeds())
    return division.modes[0]


def kv_bytes_per_token(config: object, dtype_bytes: int = 2) -> int:
    """Bytes of KV cache one token takes over all of a model's blocks (keys and values), from its HF config."""
    layers = int(getattr(config, "num_hidden_layers"))
    heads = int(getattr(config, "num_attention_heads"))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(getattr(config, "hidden_size")) // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def migrator_for(mode: Mode) -> Migrator | None:
    """The registered migrator of ``mode``; None for a deferred move."""
    if mode == Mode.DEFER:
        return None
    return MIGRATORS[mode]
