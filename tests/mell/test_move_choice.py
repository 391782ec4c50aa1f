"""How a leased session's move picks its mode (client/migration.py): the adaptive division over that one move with the
client's per-move budgets, the faster mode by default, and the migrator registered for each mode (no swarm)."""

from __future__ import annotations

import pytest

from petals_chain.client.lease import LeaseOptions
from petals_chain.client.migration import KvTransfer, TokenReplay, choose_mode, kv_bytes_per_token, migrator_for
from petals_chain.mell.hybrid import Mode, Speeds
from petals_chain.model import SpecError


class _Llama7B:
    hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers = 4096, 32, 32, 32


class _SmolLM2:
    hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers = 576, 9, 3, 30


def test_the_default_picks_the_faster_mode_for_the_model() -> None:
    """Default options (no budget bound, 10 Gbit/s, 8,000 tokens/s): a 7B session's 512 KB per token take 419 µs per
    token over the link against 125 µs of re-prefill, so it replays; SmolLM2's 23 KB (18 µs) go by KV transfer.
    First fit sends both by KV transfer."""
    opts = LeaseOptions()
    big, small = kv_bytes_per_token(_Llama7B), kv_bytes_per_token(_SmolLM2)
    assert (big, small) == (524_288, 23_040)
    args = (opts.move_link_bytes, opts.move_prefill_tokens, opts.move_rule, opts.move_speeds)
    assert opts.move_rule == "fastest"
    assert choose_mode(1000, big, *args) == Mode.TOKEN
    assert choose_mode(1000, small, *args) == Mode.KV
    assert choose_mode(1000, big, opts.move_link_bytes, opts.move_prefill_tokens, "first") == Mode.KV
    slow_link = Speeds(default_link_bytes_per_s=1e6)  # 23 ms per SmolLM2 token: replay is faster
    assert choose_mode(1000, small, opts.move_link_bytes, opts.move_prefill_tokens, "fastest", slow_link) == Mode.TOKEN


def test_budgets_bound_the_choice_and_each_mode_has_its_migrator() -> None:
    """No link budget: token replay whatever the speeds; no budget at all: deferred (no migrator); a budget the
    cache does not fit in: the other mode. KV and token modes each have their registered migrator."""
    small = kv_bytes_per_token(_SmolLM2)
    assert choose_mode(1000, small, 0.0, 1 << 30) == Mode.TOKEN
    assert choose_mode(1000, small, 0.0, 0) == Mode.DEFER
    assert choose_mode(1000, small, 1000 * small - 1, 0) == Mode.DEFER
    assert choose_mode(1000, small, 1000 * small, 0) == Mode.KV
    assert migrator_for(Mode.DEFER) is None
    assert isinstance(migrator_for(Mode.KV), KvTransfer) and isinstance(migrator_for(Mode.TOKEN), TokenReplay)


def test_bad_move_options_are_refused_naming_the_field() -> None:
    """An unknown rule or a profile that is not a Speeds is a SpecError naming the option."""
    with pytest.raises(SpecError, match="move_rule"):
        LeaseOptions(move_rule="quickest")
    with pytest.raises(SpecError, match="move_speeds"):
        LeaseOptions(move_speeds={"link": 1e9})
    with pytest.raises(SpecError, match="move_link_bytes"):
        LeaseOptions(move_link_bytes=-1.0)
