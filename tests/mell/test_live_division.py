"""The live bench's check of the adaptive division against measured downtimes, and its argument errors (no swarm)."""

from __future__ import annotations

import csv
from pathlib import Path

from petals_chain.bench import mell as bench_mell
from petals_chain.experiments.mell_live import DowntimeRow, division_check, kv_bytes_per_token

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
    assert bench_mell.run(["--division-only", "-3"]) == 2
    assert capsys.readouterr().out.startswith("error: --division-only")


def test_the_fastest_rule_picks_the_faster_mode_in_every_measured_case() -> None:
    """The measured downtime table (results/mell_downtime.csv: KV transfer vs token replay of 128-2048 tokens, on
    loopback and under a 10 Mbit/s tbf cap): with each link's speeds profiled from its shortest and longest session
    and budgets both modes fit in, rule 'fastest' picks the mode that was faster in all 8 cases; first fit, which
    always tries KV first, is right exactly where KV transfer was faster (4 of 8 in the committed quiet run), best fit
    (the least slack: the slower mode) in fewer cases than the fastest rule (0 of 8); within the simulator's epoch
    limits the fastest rule never picks a mode that does not fit."""
    path = Path(__file__).resolve().parents[2] / "results" / "mell_downtime.csv"
    rows = [DowntimeRow(r["link"], int(r["tokens"]), int(r["position"]), r["mode"], r["direction"],
                        float(r["migrate_s"]), float(r["gap_s"]), float(r["normal_gap_s"]), float(r["downtime_s"]),
                        float(r["freed_s"]), int(r["kv_bytes"])) for r in csv.DictReader(path.open())]
    checks = division_check(rows)
    assert len(checks) == 8 and {c["faster"] for c in checks} == {"kv", "token"}
    for c in checks:
        print(f"{c['link']:>14} {c['tokens']:>5}: KV {c['kv_downtime_s']:7.2f} s (est. {c['kv_estimate_s']:7.2f}), "
              f"replay {c['replay_downtime_s']:7.2f} s (est. {c['replay_estimate_s']:7.2f}); faster {c['faster']:>5}, "
              f"fastest {c['fastest_both']:>5}, first {c['first_fit_both']:>5}, best {c['best_fit_both']:>5}")
    assert all(c["fastest_both"] == c["faster"] for c in checks)
    assert sum(c["first_fit_both"] == c["faster"] for c in checks) == sum(c["faster"] == "kv" for c in checks)
    assert all(c["first_fit_both"] == "kv" for c in checks)
    assert sum(c["best_fit_both"] == c["faster"] for c in checks) < len(checks)
    assert all(c["fastest"] in (c["faster"], "defer") for c in checks)
