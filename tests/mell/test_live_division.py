"""The live bench's check of the adaptive division against measured downtimes, and its argument errors (no swarm)."""

from __future__ import annotations

from petals_chain.bench import mell as bench_mell
from petals_chain.bench.mell_live import DowntimeRow, division_check, kv_bytes_per_token

PER_TOKEN = 46_080  # SmolLM2-135M, float32, 30 blocks


def _rows(kv_s: dict[int, float], replay_s: dict[int, float]) -> list[DowntimeRow]:
    """A KV and a replay row per length, with migration time = downtime."""
    rows = []
    for n in kv_s:
        rows.append(DowntimeRow("lo", n, n, "kv", "a", kv_s[n], kv_s[n], 0.0, kv_s[n], 0.01, n * PER_TOKEN))
        rows.append(DowntimeRow("lo", n, n, "replay", "b", replay_s[n], replay_s[n], 0.0, replay_s[n], 0.01,
                                n * PER_TOKEN))
    return rows


def test_division_check_compares_the_picks_with_the_faster_mode() -> None:
    """Fast link, slow prefill: KV is faster everywhere; first fit picks KV while the transfer fits the 2 s budget
    and best fit picks the mode with less slack left (replay, the slower one, where both fit)."""
    # bandwidth from the largest KV move: 2048 * 46 KB in 0.2 s = 472 MB/s; prefill 2048 tokens in 8 s = 256 tok/s
    rows = _rows({128: 0.05, 2048: 0.2}, {128: 0.4, 2048: 8.0})
    checks = {c["tokens"]: c for c in division_check(rows)}
    assert abs(checks[2048]["bandwidth_MBps"] - 2048 * PER_TOKEN / 0.2 / 1e6) < 1e-9
    assert abs(checks[2048]["prefill_tok_s"] - 256.0) < 1e-9
    assert checks[128]["faster"] == checks[2048]["faster"] == "kv"
    assert checks[128]["first_fit"] == checks[2048]["first_fit"] == "kv"
    # 128 tokens: replay needs 128 of the 128-token prefill budget (0 slack), KV leaves ~99 %: best fit picks replay
    assert checks[128]["best_fit"] == "token"
    # 2048 tokens: replay does not fit the prefill budget; KV fits the link budget
    assert checks[2048]["best_fit"] == "kv"
    # an epoch long enough for both: first fit still tries KV first, best fit takes the slower mode (replay)
    assert checks[2048]["first_fit_both"] == "kv" and checks[2048]["best_fit_both"] == "token"


def test_division_check_on_a_slow_link_prefers_replay_when_kv_does_not_fit() -> None:
    """A link that moves the largest cache in 10 s (over the 2 s budget) while replay is quick: replay is faster
    and both rules pick it for the large move."""
    rows = _rows({128: 0.7, 2048: 10.0}, {128: 0.05, 2048: 0.5})
    checks = {c["tokens"]: c for c in division_check(rows)}
    assert checks[2048]["faster"] == "token"
    assert checks[2048]["first_fit"] == checks[2048]["best_fit"] == "token"
    assert checks[2048]["first_fit_both"] == "kv" and checks[2048]["best_fit_both"] == "kv"  # KV: the slower one


def test_kv_bytes_per_token_from_the_config() -> None:
    """2 · kv_heads · head_dim · 4 B · blocks (SmolLM2: 3 KV heads of 64, 30 blocks)."""

    class Cfg:
        hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers = 576, 9, 3, 30

    assert kv_bytes_per_token(Cfg) == PER_TOKEN


def test_live_bench_rejects_bad_lengths(capsys) -> None:
    """Bad --lengths / --cap-mbit: one line, exit code 2, before any swarm starts."""
    for argv in (["--live-only", "--lengths", "0,128"], ["--live-only", "--lengths", "4096"],
                 ["--live-only", "--lengths", "abc"], ["--live", "--cap-mbit", "-1"]):
        assert bench_mell.run(argv) == 2
        assert capsys.readouterr().out.startswith("error: --lengths")
