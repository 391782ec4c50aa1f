"""One forward pass over a span of PETALS LLaMA blocks for the inference steps of many sessions at once.

PETALS' server runs one session's step at a time: its inference pool hands the runtime one task, and
``TransformerBackend.inference_step`` runs the span's blocks over that session's tokens with that session's
KV cache. This module is the arithmetic a batching server needs instead (docs/batching.md): given N sessions,
each with its own cache tensors (PETALS' layout, see :class:`SessionStep`), its own prefix length and its own
new tokens (1 for a decode step, more for a prefill or a speculative verification), it runs every block once
for all of them and writes each session's new keys and values into that session's cache.

Design ("packed tokens, per-session attention over the caches in place"):

* every token-wise operation (both RMSNorms, the q/k/v/o projections, rotary embeddings, the MLP) runs on one
  packed ``[T, hidden]`` matrix holding all sessions' new tokens back to back (T = the sum of tokens), so a
  block's weights are read once per step for all sessions and nothing is padded;
* attention is the only operation that needs a session's history. It runs per session, directly on views of
  that session's own cache tensors: the step's keys and values are first written into the cache at positions
  ``prefix_length ... prefix_length + n - 1``, then the queries attend to the first ``prefix_length + n``
  cached positions. No cache is copied, concatenated or padded, and a session of 4 tokens next to one of
  4000 costs neither anything extra;
* rollback needs nothing special: a session that continues from an earlier position simply comes with a
  smaller ``prefix_length``; its stale positions beyond the new end are overwritten or never read.

Attention has a second mechanism, ``attention="gathered"``, for the sessions that decode one token: their cached
keys and values up to the longest prefix are copied into one padded batch, and one masked matmul pair serves them
all. It reads every cache twice instead of once, but launches a constant number of kernels per layer instead of a
few per session, which is what an accelerator needs once the per-session loop is launch-bound
(results/gpu-batched/); on this machine's CPU the per-session loop is faster (``bench server-step``'s attention
alternatives). Sessions with more tokens (prefill, verification of k > 1 speculative tokens) take the per-session
path beside them: the step packs the decoding sessions first, attends over them gathered and over the others one
by one, so one speculative session does not push a whole decode batch onto the per-session loop
(results/gpu-width-batch/).

This module is torch only (no RPC, no pools) and changes nothing in the live server by itself; the server-side
adapter that reads PETALS' cache handles is :class:`BatchedMergedInferenceStep`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from petals_chain.defaults import BATCH_ATTENTION_MECHANISMS

# Attention logits of one session are computed in query chunks no larger than this (bytes), as PETALS bounds
# its own logits with ``max_chunk_size_bytes``; a long prefill then needs bounded working memory.
DEFAULT_MAX_LOGITS_BYTES = 256 * 1024 * 1024


def rotate_half(t: torch.Tensor) -> torch.Tensor:
    """LLaMA's rotary helper (the same arithmetic as transformers'): halves ``(a, b)`` of the last dim → ``(−b, a)``.

    Ours so that this module needs torch alone (the GPU measurement runs it where transformers differs)."""
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@dataclass
class SessionStep:
    """One session's inference step over the span.

    ``hidden_states``: ``[batch, n_new, hidden]``, the session's new tokens (``batch`` is the session's number of
    hypotheses, 1 for greedy decoding and sampling). ``caches``: per block of the span, the session's
    ``(keys, values)`` tensors in PETALS' per-session layout, keys ``[batch, kv_heads, head_dim, max_length]`` and
    values ``[batch, kv_heads, max_length, head_dim]`` (``TransformerBackend.get_inference_cache_descriptors``).
    ``prefix_length``: how many cached positions the step attends to before its own tokens; the step writes its
    keys and values at ``prefix_length ... prefix_length + n_new - 1``. A value smaller than the session's last
    length is a rollback. ``hypo_ids``: optional ``[batch]`` int64 indices that reorder the session's cache
    rows before the step (beam search), as PETALS does.
    """

    hidden_states: torch.Tensor
    caches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    prefix_length: int
    hypo_ids: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        """Tokens this step adds per hypothesis."""
        return int(self.hidden_states.shape[1])

    @property
    def end(self) -> int:
        """The session's length after the step."""
        return self.prefix_length + self.n_tokens


@dataclass
class _Gather:
    """A decode step's plan for the gathered mechanism: the padded length, the ``[T, 1, 1, L]`` mask of positions each
    packed row must not see, each row's new position (``[T]``), and the arena rows of the last block seen."""

    longest: int
    mask: torch.Tensor
    positions: torch.Tensor
    sessions: int = 0  # the plan covers the first ``sessions`` packed sessions (the decoding ones) ...
    tokens: int = 0  # ... whose rows are the first ``tokens`` packed rows; the rest attend per session
    rows_key: tuple[int, ...] = ()
    rows: torch.Tensor | None = None  # arena row of every packed row
    lo: int = 0  # the arena rows lo ... lo + span - 1 hold every packed row
    span: int = 0
    in_place: bool = False  # dense enough to attend over that range of the arena in place (no copy)
    span_index: torch.Tensor | None = None  # rows - lo; None when the rows are exactly lo ... lo + T - 1
    span_mask: torch.Tensor | None = None  # the mask over the range (rows with no session see position 0 only)

    def set_rows(self, rows: list[int], device: torch.device) -> None:
        """Adopt the arena rows of a block (blocks allocated in step share them: computed once per step)."""
        self.rows_key = tuple(rows)
        self.rows = torch.tensor(rows, device=device)
        self.lo, self.span = min(rows), max(rows) - min(rows) + 1
        # in place when no row repeats and at most half of the range is idle (attention over idle rows is waste)
        self.in_place = len(set(rows)) == len(rows) and self.span <= 2 * len(rows)
        self.span_index = self.span_mask = None
        if self.in_place and rows != list(range(self.lo, self.lo + len(rows))):
            self.span_index = self.rows - self.lo
            span_mask = torch.ones(self.span, 1, 1, self.longest, dtype=torch.bool, device=device)
            span_mask[..., 0] = False
            span_mask[self.span_index] = self.mask
            self.span_mask = span_mask


def arena_rows(steps: Sequence[SessionStep], index: int) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
    """``(keys arena, values arena, the arena row of every packed row)`` when the caches of block ``index`` of every
    session are views of the same two arena tensors, one session's ``batch`` consecutive rows each (what an arena
    memory cache hands out: ``arena[slot:slot + batch, ..., :length]``); None otherwise."""
    keys0, values0 = steps[0].caches[index]
    ak, av = keys0._base, values0._base
    if ak is None or av is None or ak.dim() != 4 or av.dim() != 4 or not ak.is_contiguous() or not av.is_contiguous():
        return None
    rows: list[int] = []
    for s in steps:
        keys, values = s.caches[index]
        if keys._base is not ak or values._base is not av or keys.stride() != ak.stride() \
                or values.stride() != av.stride():
            return None
        slot, rest = divmod(keys.storage_offset() - ak.storage_offset(), ak.stride(0))
        if rest or values.storage_offset() - av.storage_offset() != slot * av.stride(0):
            return None
        rows.extend(range(slot, slot + keys.shape[0]))
    return ak, av, rows


def unwrap_block(block: nn.Module) -> nn.Module:
    """The LLaMA decoder layer inside ``block``: PETALS wraps each served block in a one-device TensorParallel.

    A block split over several devices (tensor parallelism) is refused: its heads live on different devices and
    this step runs one device's attention.
    """
    shards = getattr(block, "module_shards", None)
    if shards is not None:
        if len(shards) != 1:
            raise ValueError(f"batched step needs unsplit blocks, got a TensorParallel over {len(shards)} devices")
        block = shards[0]
    for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"):
        if not hasattr(block, name):
            raise TypeError(f"{type(block).__name__} is not a LLaMA decoder layer (no {name})")
    return block


class BatchedSpanStep:
    """Runs the blocks of one span over many sessions' steps in one pass (see the module's docstring).

    Built once per span from the blocks the server serves (``WrappedLlamaBlock``s, bare or in PETALS'
    TensorParallel wrapper); holds no per-session state, so the same object serves every step.
    """

    fused_attention = False  # set in an emulated device's server only (server/fused_attention.py)

    def __init__(self, blocks: Sequence[nn.Module], *, max_logits_bytes: int = DEFAULT_MAX_LOGITS_BYTES,
                 attention: str = "per_session"):
        if not blocks:
            raise ValueError("a span needs at least one block")
        if attention not in BATCH_ATTENTION_MECHANISMS:
            raise ValueError(f"attention must be one of {', '.join(BATCH_ATTENTION_MECHANISMS)}, got {attention!r}")
        self.attention = attention
        self.layers = [unwrap_block(b) for b in blocks]
        attn = self.layers[0].self_attn
        self.num_heads: int = attn.num_heads
        self.num_kv_heads: int = attn.num_key_value_heads
        self.head_dim: int = attn.head_dim
        self.groups = self.num_heads // self.num_kv_heads
        self.hidden_size: int = attn.hidden_size
        # Every block of a LLaMA model has the same rotary table, so one block's module serves the whole span.
        self.rotary = attn.rotary_emb
        self.max_logits_bytes = max_logits_bytes

    # -- validation -------------------------------------------------------------------------------------------

    def _check(self, steps: Sequence[SessionStep]) -> None:
        """ValueError naming the session and the field for anything the step cannot run."""
        for i, s in enumerate(steps):
            h = s.hidden_states
            if h.ndim != 3 or h.shape[2] != self.hidden_size:
                raise ValueError(f"session {i}: hidden_states must be [batch, n, {self.hidden_size}],"
                                 f" got {tuple(h.shape)}")
            if len(s.caches) != len(self.layers):
                raise ValueError(f"session {i}: {len(s.caches)} cache pairs for {len(self.layers)} blocks")
            keys, values = s.caches[0]
            want_k = (h.shape[0], self.num_kv_heads, self.head_dim)
            bad_values = values.shape[:2] != keys.shape[:2] or values.shape[3] != self.head_dim
            if tuple(keys.shape[:3]) != want_k or bad_values:
                raise ValueError(f"session {i}: cache shapes {tuple(keys.shape)}, {tuple(values.shape)} do not fit"
                                 f" batch {h.shape[0]}, {self.num_kv_heads} KV heads of {self.head_dim}")
            max_length = min(keys.shape[3], values.shape[2])
            if not 0 <= s.prefix_length <= max_length - s.n_tokens:
                raise ValueError(f"session {i}: prefix {s.prefix_length} + {s.n_tokens} new tokens exceeds the"
                                 f" cache's {max_length} positions (or the prefix is negative)")

    # -- memory -----------------------------------------------------------------------------------------------

    def working_bytes(self, steps: Sequence[SessionStep]) -> int:
        """Upper bound on what one call allocates beyond the weights and the caches (docs/batching.md, "Memory").

        Token-wise work lives on the packed ``[T, hidden]`` rows: at most 12 rows of width ``hidden`` in float32
        (RMSNorm computes in float32; x, the residual, q, k, v, rotary temporaries, attention output) and 4 rows
        of the MLP's width per token, so it grows with the step's tokens T (≤ the server's
        ``--max-batch-tokens``), never with the cached context. Attention adds, per-session mechanism, one
        session's logits chunk at a time (scores, masked scores, float32 probabilities: 3 × ≤
        ``max_logits_bytes``); gathered mechanism, the padded keys and values of the batch up to the longest
        prefix, and the logits of every row over it.
        """
        live = [s for s in steps if s.hidden_states.numel() > 0]
        if not live:
            return 0
        element = live[0].hidden_states.element_size()
        tokens = sum(s.hidden_states.shape[0] * s.n_tokens for s in live)
        intermediate = self.layers[0].mlp.gate_proj.out_features
        packed = tokens * (12 * self.hidden_size * max(element, 4) + 4 * intermediate * element)
        heads, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = live[0].hidden_states.reshape(-1, self.hidden_size)
        live = [live[i] for i in self._packing_order(live, x.device)]
        gather = self._gather_plan(live, x)
        gathered = 0
        if gather is not None:
            longest, rows = gather.longest, gather.tokens
            gathered = 2 * rows * kvh * d * longest * element + rows * heads * longest * (3 * element + 4) \
                + rows * longest
        logits = 0
        for s in live[gather.sessions if gather is not None else 0:]:
            row = s.hidden_states.shape[0] * heads * s.end * 4
            logits = max(logits, row * max(1, min(s.n_tokens, self.max_logits_bytes // max(1, row))))
        return packed + gathered + 3 * logits

    # -- the step ---------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(self, steps: Sequence[SessionStep]) -> list[torch.Tensor]:
        """Run the span over every session's new tokens; returns each session's outputs ``[batch, n, hidden]``.

        Side effect, as in PETALS' ``inference_step``: each session's caches hold its new keys and values at
        ``prefix_length ... end - 1`` (and are first reordered by its ``hypo_ids``, if any).
        """
        self._check(steps)
        live = [s for s in steps if s.hidden_states.numel() > 0]
        for s in live:
            if s.hypo_ids is not None:
                for keys, values in s.caches:
                    keys[...] = keys[s.hypo_ids.to(keys.device)]
                    values[...] = values[s.hypo_ids.to(values.device)]
        if not live:
            return [s.hidden_states for s in steps]

        order = self._packing_order(live, live[0].hidden_states.device)  # indices into live
        packed = [live[i] for i in order]
        x = torch.cat([s.hidden_states.reshape(-1, self.hidden_size) for s in packed])  # [T, hidden], packed
        cos, sin = self._rotary_tables(packed, x)
        gather = self._gather_plan(packed, x)
        for index, layer in enumerate(self.layers):
            x = self._layer(layer, index, x, packed, cos, sin, gather)

        outputs: list[torch.Tensor] = [None] * len(live)  # type: ignore[list-item]  # per live session
        offset = 0
        for i, s in zip(order, packed):
            size = s.hidden_states.shape[0] * s.n_tokens
            outputs[i] = x[offset:offset + size].view_as(s.hidden_states)
            offset += size
        it = iter(outputs)
        return [s.hidden_states if s.hidden_states.numel() == 0 else next(it) for s in steps]

    def _gathers(self, device: torch.device) -> bool:
        """Whether decoding sessions attend gathered here (``auto``: on CUDA only)."""
        mode = self.attention
        if mode == "auto":
            mode = "gathered" if device.type == "cuda" else "per_session"
        return mode == "gathered"

    def _packing_order(self, steps: Sequence[SessionStep], device: torch.device) -> list[int]:
        """The indices of ``steps`` in the order their rows are packed: as given, except that where the decoding
        sessions (one token each) attend gathered beside sessions of more tokens, the decoding ones come first (in
        their order), so that the gathered attention covers one leading range of rows."""
        order = list(range(len(steps)))
        if not self._gathers(device):
            return order
        decoding = [i for i in order if steps[i].n_tokens == 1]
        if len(decoding) < 2 or len(decoding) == len(steps):
            return order
        return decoding + [i for i in order if steps[i].n_tokens != 1]

    def _rotary_tables(self, steps: Sequence[SessionStep], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, 1, head_dim]`` of every packed token's absolute position (its session's own)."""
        positions = torch.cat([
            torch.arange(s.prefix_length, s.end, device=x.device).repeat(s.hidden_states.shape[0]) for s in steps
        ])
        cos, sin = self.rotary(x, seq_len=max(s.end for s in steps))  # [1, 1, longest, head_dim]
        return cos[0, 0, positions].unsqueeze(1), sin[0, 0, positions].unsqueeze(1)

    def _gather_plan(self, steps: Sequence[SessionStep], x: torch.Tensor) -> _Gather | None:
        """The gathered mechanism's plan for the leading decoding sessions of ``steps`` (packed as
        :meth:`_packing_order` puts them), or None when the whole step takes the per-session path (see the module's
        docstring): fewer than two sessions decode one token, they are not the leading ones, or a cache is shorter
        than the padded length and not an arena's slot (an arena row always has the arena's full length)."""
        if not self._gathers(x.device):
            return None
        count = next((i for i, s in enumerate(steps) if s.n_tokens != 1), len(steps))
        if count < 2 or any(s.n_tokens == 1 for s in steps[count:]):
            return None
        steps = steps[:count]
        longest = max(s.end for s in steps)
        arena = arena_rows(steps, 0)
        if arena is not None:
            if min(arena[0].shape[3], arena[1].shape[2]) < longest:
                return None
        elif any(min(s.caches[0][0].shape[3], s.caches[0][1].shape[2]) < longest for s in steps):
            return None  # a cache shorter than the padded length: its view would not exist
        ends = torch.tensor([s.end for s in steps for _ in range(s.hidden_states.shape[0])], device=x.device)
        mask = torch.arange(longest, device=x.device).unsqueeze(0) >= ends.unsqueeze(1)
        return _Gather(longest, mask.view(-1, 1, 1, longest), ends - 1, count, int(ends.numel()))

    def _layer(self, layer: nn.Module, index: int, x: torch.Tensor, steps: Sequence[SessionStep],
               cos: torch.Tensor, sin: torch.Tensor, gather: _Gather | None = None) -> torch.Tensor:
        """One decoder layer over the packed tokens: token-wise parts packed, attention per session."""
        attn = layer.self_attn
        tokens = x.shape[0]
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(tokens, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(tokens, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(h).view(tokens, self.num_kv_heads, self.head_dim)
        q = (q * cos + rotate_half(q) * sin) * (1.0 / math.sqrt(self.head_dim))
        k = k * cos + rotate_half(k) * sin

        if gather is None:
            out = self._attend_per_session(q, k, v, steps, index)
        elif gather.sessions == len(steps):
            out = self._attend_gathered(q, k, v, steps, index, gather)
        else:  # the leading decoding sessions gathered, the sessions of more tokens one by one
            t = gather.tokens
            out = torch.cat([
                self._attend_gathered(q[:t], k[:t], v[:t], steps[:gather.sessions], index, gather)
                .reshape(t, self.num_heads, self.head_dim),
                self._attend_per_session(q[t:], k[t:], v[t:], steps[gather.sessions:], index)])
        x = x + attn.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _attend_per_session(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, steps: Sequence[SessionStep],
                            index: int) -> torch.Tensor:
        """Each session's new keys and values written into its own cache, then its attention over the cache in
        place (:meth:`_attend`). Returns ``[T, heads, head_dim]``."""
        out = torch.empty_like(q)
        offset = 0
        for s in steps:
            batch, n = s.hidden_states.shape[0], s.n_tokens
            size = batch * n
            keys, values = s.caches[index]
            p = s.prefix_length
            shape = (batch, n, self.num_kv_heads, self.head_dim)
            keys.narrow(3, p, n).copy_(k.narrow(0, offset, size).view(shape).permute(0, 2, 3, 1))
            values.narrow(2, p, n).copy_(v.narrow(0, offset, size).view(shape).transpose(1, 2))
            self._attend(q.narrow(0, offset, size), out.narrow(0, offset, size), keys, values, batch, n, p)
            offset += size
        return out

    def _attend_gathered(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, steps: Sequence[SessionStep],
                         index: int, plan: _Gather) -> torch.Tensor:
        """Decode attention of every session at once (one token per hypothesis): write each session's new key and
        value at its position, copy every cache's first ``longest`` positions into one padded batch, attend once.
        When the caches are rows of one arena per block (:func:`arena_rows`), the write is one indexed operation,
        and the batch is not copied at all when its rows fill at least half of a range of the arena (attention then
        runs over that range in place, idle rows computed and dropped), else gathered by one indexed copy. Returns
        ``[T, kv_heads, groups, head_dim]``."""
        kvh, g, d = self.num_kv_heads, self.groups, self.head_dim
        longest = plan.longest
        tokens = q.shape[0]
        arena = arena_rows(steps, index)
        if arena is not None:
            ak, av, rows = arena
            if tuple(rows) != plan.rows_key:
                plan.set_rows(rows, ak.device)
            ak[plan.rows, :, :, plan.positions] = k
            av[plan.rows, :, plan.positions] = v
            if plan.in_place:  # attend over the arena's rows lo ... lo + span - 1 where they lie: nothing is copied
                keys = ak.narrow(0, plan.lo, plan.span).narrow(3, 0, longest)
                values = av.narrow(0, plan.lo, plan.span).narrow(2, 0, longest)
                if plan.span_index is None:
                    return self._padded_attention(q.view(tokens, kvh, g, d), keys, values, plan.mask)
                q_span = q.new_zeros(plan.span, kvh, g, d)
                q_span[plan.span_index] = q.view(tokens, kvh, g, d)
                return self._padded_attention(q_span, keys, values, plan.span_mask)[plan.span_index]
            keys = ak.narrow(3, 0, longest)[plan.rows]
            values = av.narrow(2, 0, longest)[plan.rows]
        else:
            # method calls (select, narrow, split) rather than indexing: this loop runs for every session and layer
            pairs = [s.caches[index] for s in steps]
            positions = [s.prefix_length for s in steps]
            dst_k = [c.select(3, p) for (c, _), p in zip(pairs, positions)]
            dst_v = [c.select(2, p) for (_, c), p in zip(pairs, positions)]
            sizes = [s.hidden_states.shape[0] for s in steps]
            src_k, src_v = k.split(sizes), v.split(sizes)
            torch._foreach_copy_(dst_k + dst_v, [*src_k, *src_v])
            keys = torch.cat([c.narrow(3, 0, longest) for c, _ in pairs])
            values = torch.cat([c.narrow(2, 0, longest) for _, c in pairs])
        return self._padded_attention(q.view(tokens, kvh, g, d), keys, values, plan.mask)

    @staticmethod
    def _padded_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          mask: torch.Tensor) -> torch.Tensor:
        """One masked attention of rows ``q [R, kv_heads, groups, head_dim]`` over ``keys [R, kv_heads, head_dim,
        L]`` and ``values [R, kv_heads, L, head_dim]``; ``mask [R, 1, 1, L]`` hides what a row must not see."""
        scores = torch.matmul(q, keys).masked_fill(mask, float("-inf"))  # [R, kv_heads, groups, L]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values)  # [R, kv_heads, groups, head_dim]

    def _attend(self, q: torch.Tensor, out: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                batch: int, n: int, p: int) -> None:
        """Causal attention of one session's ``n`` queries (positions ``p ...``) over its cache, into ``out``.

        Queries of the ``groups`` heads that share a KV head are stacked as rows of one matrix, so grouped-query
        attention needs no repeated keys; long steps are cut into query chunks whose logits fit
        ``max_logits_bytes``.
        """
        kvh, g, d = self.num_kv_heads, self.groups, self.head_dim
        q5 = q.view(batch, n, kvh, g, d).permute(0, 2, 3, 1, 4)  # [batch, kv_heads, groups, n, head_dim]
        out5 = out.view(batch, n, kvh, g, d).permute(0, 2, 3, 1, 4)
        if self.fused_attention:  # an emulated device's server (server/fused_attention.py): one fused call
            from petals_chain.server.causal_attention import fused_causal

            end = p + n
            att = fused_causal(q5.reshape(batch, kvh * g, n, d), _grouped(keys.narrow(3, 0, end).transpose(2, 3), g),
                               _grouped(values.narrow(2, 0, end), g), p, scale=1.0)  # q is scaled already
            out5.copy_(att.view(batch, kvh, g, n, d))
            return
        row_bytes = batch * kvh * g * (p + n) * 4  # float32 softmax of one query position
        chunk = max(1, min(n, self.max_logits_bytes // max(1, row_bytes)))
        for c0 in range(0, n, chunk):
            m = min(chunk, n - c0)
            end = p + c0 + m
            scores = torch.matmul(q5.narrow(3, c0, m).reshape(batch, kvh, g * m, d), keys.narrow(3, 0, end))
            if m > 1:  # query i (position p + c0 + i) sees keys 0 ... p + c0 + i
                i = torch.arange(m, device=q.device).unsqueeze(1)
                j = torch.arange(end, device=q.device).unsqueeze(0)
                masked = (j > p + c0 + i).repeat(g, 1)  # rows ordered (group, position)
                scores = scores.masked_fill(masked, float("-inf"))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out5.narrow(3, c0, m).copy_(torch.matmul(probs, values.narrow(2, 0, end)).view(batch, kvh, g, m, d))


def _grouped(t: torch.Tensor, groups: int) -> torch.Tensor:
    """``[batch, kv_heads, L, d]`` repeated per query group: ``[batch, kv_heads · groups, L, d]``."""
    if groups == 1:
        return t
    b, h, length, d = t.shape
    return t.unsqueeze(2).expand(b, h, groups, length, d).reshape(b, h * groups, length, d)


class BatchedMergedInferenceStep:
    """The batched counterpart of PETALS' ``_MergedInferenceStep``: many sessions' steps over the same backends.

    ``backends`` maps block uids to PETALS' ``TransformerBackend``s of one span (the server's own objects). A
    call takes, per session, its hidden states, hypo ids and the ``InferenceMetadata`` tuple that PETALS' handler
    builds for the merged pool (one per block, with that block's cache handles and the session's prefix
    length), resolves the handles with the backends' ``memory_cache`` and runs :class:`BatchedSpanStep`.
    Sessions with deep prompts or an active adapter are refused: the server must run those alone.
    """

    def __init__(self, backends: Mapping[str, nn.Module], **kwargs):
        self.backends = dict(backends)
        self.memory_cache = next(iter(self.backends.values())).memory_cache
        self._steps: dict[tuple[str, ...], BatchedSpanStep] = {}
        self._kwargs = kwargs

    def _span_step(self, uids: tuple[str, ...]) -> BatchedSpanStep:
        """The (cached) batched step over the blocks ``uids``."""
        if uids not in self._steps:
            self._steps[uids] = BatchedSpanStep([self.backends[u].module for u in uids], **self._kwargs)
        return self._steps[uids]

    @torch.inference_mode()
    def __call__(self, requests: Sequence[tuple[torch.Tensor, torch.Tensor, Sequence]]) -> list[torch.Tensor]:
        """``requests``: per session ``(hidden_states, hypo_ids, inference_infos)``; returns per session outputs."""
        if not requests:
            return []
        uids = tuple(info.uid for info in requests[0][2])
        for _, _, infos in requests:
            if tuple(info.uid for info in infos) != uids:
                raise ValueError("sessions of one batched step must cover the same blocks")
            if any(info.active_adapter for info in infos):
                raise ValueError("sessions with an active adapter cannot be batched")
            if len({info.prefix_length for info in infos}) != 1:
                raise ValueError("a session's blocks must share one prefix length")
        handles = [h for _, _, infos in requests for info in infos for h in info.cache_handles]
        with self.memory_cache.use_cache(*handles) as tensors:
            steps, at = [], 0
            for hidden_states, hypo_ids, infos in requests:
                caches = []
                for info in infos:
                    pair = tensors[at:at + len(info.cache_handles)]
                    if len(pair) != 2:
                        raise ValueError("batched step serves one-device blocks: two cache tensors per block")
                    caches.append((pair[0], pair[1]))
                    at += len(info.cache_handles)
                ids = None if hypo_ids is None or hypo_ids.numel() == 0 else hypo_ids
                steps.append(SessionStep(hidden_states, caches, infos[0].prefix_length, ids))
            return self._span_step(uids)(steps)
