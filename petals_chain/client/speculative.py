"""Speculative greedy decoding through a leased session, with rollback on every server of the chain.

Each step sends the pending token and up to ``width - 1`` drafted tokens through the chain at once (one round trip
per hop for ``width`` positions), keeps the drafts the model itself would have written, and rolls every server's
cache back to the last kept position (``start_from_position``, patches/0003). Drafts need no second model: they are
looked up in the prompt and the text written so far (docs/moldable.md, "Speculative width on the swarm").
The output is the plain greedy continuation, token for token. A model loaded with ``speculative_k_max`` does this in
``model.generate()`` at the width its lease says (docs/moldable.md, "Width through the lease API").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hivemind.proto import runtime_pb2
from hivemind.utils.serializer import MSGPackSerializer
from petals.client.inference_session import _ServerInferenceSession

from petals_chain.client.drafts import Drafter, prompt_lookup_draft
from petals_chain.moldable.width_range import WidthError, check_width
from petals_chain.client.sequence_manager import OrchestratedSequenceManager
from petals_chain.client.session import LeasedInferenceSession

__all__ = ["RollbackServerSession", "SpeculativeGenerationMixin", "SpeculativeSession", "SpeculativeStats",
           "WidthError", "check_width", "open_speculative_session", "prompt_lookup_draft", "speculative_generate",
           "speculative_model"]


class RollbackServerSession(_ServerInferenceSession):
    """petals' per-server session that can be moved back to an earlier position and that may wait an emulated
    round trip before each step (petals builds these as _ServerInferenceSession; SpeculativeSession re-types them)."""

    start_from_position: int | None = None  # sent with the next step, then cleared
    emulated_rtt_s: float = 0.0

    def rollback(self, position: int) -> None:
        """Forget every position from ``position`` on: the next step overwrites them on the server."""
        if not 0 <= position <= self._position:
            raise WidthError(f"position: cannot roll back to {position}; this server session holds {self._position}")
        if position == self._position:
            return
        self._position = position
        if self.history is not None:
            self.history = self.history[:, :position] if position > 0 else None
        self.start_from_position = position

    async def _step(self, inputs_serialized: runtime_pb2.ExpertRequest) -> runtime_pb2.ExpertResponse:
        """petals' step, plus the pending rollback in the request's metadata and the emulated round trip."""
        if self.start_from_position is not None and self.stepped:
            metadata = MSGPackSerializer.loads(inputs_serialized.metadata) if inputs_serialized.metadata else {}
            metadata["start_from_position"] = self.start_from_position
            inputs_serialized.metadata = MSGPackSerializer.dumps(metadata)
        self.start_from_position = None
        if self.emulated_rtt_s > 0:
            await asyncio.sleep(self.emulated_rtt_s)
        return await super()._step(inputs_serialized)


class SpeculativeSession(LeasedInferenceSession):
    """A leased session whose length can be cut back (``rollback``) on every server of its chain at once.

    ``emulated_rtt_s`` adds that round-trip time to every hop of every step (an asyncio wait on the client, so it
    occupies no server): on loopback it stands for the network between the client and each server."""

    def __init__(self, sequence_manager: OrchestratedSequenceManager, max_length: int,
                 emulated_rtt_s: float = 0.0) -> None:
        if not (isinstance(emulated_rtt_s, (int, float)) and 0 <= emulated_rtt_s < 60):
            raise WidthError(f"emulated_rtt_s: must be a number of seconds in [0, 60), got {emulated_rtt_s!r}")
        self.emulated_rtt_s = float(emulated_rtt_s)
        super().__init__(sequence_manager, max_length)

    def _enter_server_sessions(self, chosen_spans: list[Any]) -> list[Any]:
        """petals' server sessions, made rollback-capable (and delayed by the emulated RTT)."""
        sessions = super()._enter_server_sessions(chosen_spans)
        for s in sessions:
            s.__class__ = RollbackServerSession
            s.start_from_position = None
            s.emulated_rtt_s = self.emulated_rtt_s
        return sessions

    def rollback(self, position: int) -> None:
        """Make the session ``position`` tokens long: the client's copies are cut and every server overwrites the
        dropped positions with the next step's tokens."""
        if not 0 <= position <= self._position:
            raise WidthError(f"position: cannot roll back to {position}; the session holds {self._position}")
        for s in self._server_sessions:
            s.rollback(position)
        self._position = position
        if self._history is not None:
            self._history = self._history[:, :position]


def open_speculative_session(model: Any, max_length: int, emulated_rtt_s: float = 0.0) -> SpeculativeSession:
    """A SpeculativeSession on ``model``'s leasing sequence manager, already holding its lease; close() it."""
    manager = model.transformer.h.sequence_manager
    if not isinstance(manager, OrchestratedSequenceManager):
        raise TypeError("speculative sessions need a model loaded with orchestrator=URL")
    return SpeculativeSession(manager, max_length, emulated_rtt_s).__enter__()


@dataclass
class SpeculativeStats:
    """What one speculative generation did: steps (round trips along the chain), positions sent, drafts made and
    kept, tokens written, and its wall time."""

    width: int
    steps: int = 0
    positions: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    elapsed_s: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)  # the width of each step after the prefill

    @property
    def tokens_per_step(self) -> float:
        """New tokens per round trip (1 for plain greedy decoding)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time."""
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _next_tokens(model: Any, session: LeasedInferenceSession, ids: list[int]) -> list[int]:
    """Run ``ids`` through the chain on ``session`` and return the greedy next token after each position."""
    tr = model.transformer
    with torch.no_grad():
        embeds = tr.word_embeddings_layernorm(tr.word_embeddings(torch.tensor([ids], dtype=torch.long)))
        hidden = session.step(embeds)
        logits = model.lm_head(tr.ln_f(hidden))
    return logits[0].argmax(dim=-1).tolist()


def speculative_generate(model: Any, session: SpeculativeSession, prompt: Sequence[int], max_new_tokens: int,
                         width: int | Callable[[], int], *, eos_token_id: int | Collection[int] | None = None,
                         drafter: Drafter = prompt_lookup_draft) -> tuple[list[int], SpeculativeStats]:
    """Greedy continuation of ``prompt`` (token ids) verifying up to ``width`` positions per step (a callable: asked
    before every step, e.g. the width the session's lease says now); returns prompt + new tokens (stopping after an
    ``eos_token_id``, like generate()) and what it did."""
    width_now = width if callable(width) else (lambda: width)
    first = check_width(width_now())
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise WidthError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise WidthError("prompt: give at least one token")
    if session.position != 0:
        raise WidthError(f"session: must be fresh (position 0), it holds {session.position} tokens")
    stops = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    stats = SpeculativeStats(first)
    started = time.perf_counter()
    pending = _next_tokens(model, session, tokens)[-1]  # prefill: the first new token, not yet in the caches
    stats.steps, stats.positions = 1, len(tokens)
    new: list[int] = [pending]
    while len(new) < max_new_tokens and new[-1] not in stops:
        width = check_width(width_now())
        stats.widths.append(width)
        left = max_new_tokens - len(new)
        drafts = drafter(tokens + new, min(width - 1, left))[: min(width - 1, left)]
        cached = session.position
        predicted = _next_tokens(model, session, [pending, *drafts])
        kept = 0
        while kept < len(drafts) and drafts[kept] == predicted[kept]:
            kept += 1
        session.rollback(cached + 1 + kept)  # the pending token and the kept drafts stay cached
        accepted = drafts[:kept] + [predicted[kept]]
        stop = next((i for i, t in enumerate(accepted) if t in stops), None)
        if stop is not None:
            accepted = accepted[: stop + 1]
        new.extend(accepted)
        pending = new[-1]
        stats.steps += 1
        stats.positions += 1 + len(drafts)
        stats.drafted += len(drafts)
        stats.accepted += kept
        stats.accepted_per_step.append(kept)
    new = new[:max_new_tokens]
    stats.new_tokens = len(new)
    stats.elapsed_s = time.perf_counter() - started
    return tokens + new, stats


GREEDY_KWARGS = frozenset({"input_ids", "max_new_tokens", "do_sample", "num_beams", "eos_token_id", "pad_token_id",
                           "attention_mask"})


class SpeculativeGenerationMixin:
    """``model.generate()`` of a model whose sessions lease a speculative width (``LeaseOptions.k_max``): greedy
    decoding of one sequence on a fresh session verifies the number of positions its lease says (asked again before
    every step: a renew may change it), token-identical to plain greedy decoding. Anything else (sampling, beams, a
    batch, a session that already holds tokens, ``max_length``) is petals' own generate at width 1."""

    def generate(self, inputs: torch.Tensor | None = None, *args: Any, session: Any = None, **kwargs: Any) -> Any:
        """See the class docstring; the last speculative run's SpeculativeStats are on ``session.stats``."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if session is None:
            session = self.transformer.h.active_session
        mask = kwargs.get("attention_mask")
        plain = (args or not GREEDY_KWARGS.issuperset(kwargs) or kwargs.get("do_sample") or kwargs.get("num_beams", 1)
                 != 1 or kwargs.get("max_new_tokens") is None or not torch.is_tensor(ids) or ids.ndim != 2
                 or ids.shape[0] != 1 or (mask is not None and not bool(torch.all(mask == 1)))
                 or (session is not None and (not isinstance(session, SpeculativeSession) or session.position != 0)))
        if plain:
            return super().generate(inputs, *args, session=session, **kwargs)
        manager = self.transformer.h.sequence_manager
        options = manager.options
        own = session is None
        if own:
            session = open_speculative_session(self, ids.shape[1] + kwargs["max_new_tokens"] + options.k_max + 1,
                                               options.emulated_rtt_s)
        eos = kwargs.get("eos_token_id", self.generation_config.eos_token_id)
        try:
            out, stats = speculative_generate(self, session, ids[0].tolist(), kwargs["max_new_tokens"],
                                              lambda: (session.lease.width if session.lease else None) or 1,
                                              eos_token_id=eos)
        finally:
            if own:
                session.close()
        result = torch.tensor([out], dtype=ids.dtype, device=ids.device)
        session.stats, session.output_ids = stats, result
        return result


def speculative_model(model: Any) -> Any:
    """Make a loaded petals model's ``generate()`` speculative (SpeculativeGenerationMixin), in place; returns it."""
    cls = type(model)
    if not isinstance(model, SpeculativeGenerationMixin):
        model.__class__ = type(f"Speculative{cls.__name__}", (SpeculativeGenerationMixin, cls), {})
    return model
