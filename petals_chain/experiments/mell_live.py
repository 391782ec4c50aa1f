"""Live migration downtime: a SmolLM2 session moves between two chains of a loopback swarm, by KV transfer and by
token replay, at several session lengths, with and without a bandwidth cap (docs/mell.md, "Live KV transfer").

One session grows through the lengths (prompt tokens fed in chunks, then a few greedy tokens); at each length it
moves from the one-server chain to the two-server chain by KV transfer and back by token replay (after one
unreported KV migration each way that opens the connections between the peers). Downtime is the
extra inter-token gap: the gap that spans the migration minus the median gap of the steps around it. The cap is
``tc tbf`` on the loopback of a network namespace that the whole swarm runs in (``netem`` is not available here),
so it slows every byte of the swarm, the client's included. Needs root for the namespace.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.common import REPO

MODEL_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
MAX_LENGTH = 2048  # SmolLM2's context: prompt + generated tokens must fit
LENGTHS = (128, 512, 1024, 2048)
STEP_TIMEOUT_S = 900.0
GEN_TOKENS = 3  # greedy tokens before and after each migration (the gaps around it)


class LiveBenchError(RuntimeError):
    """The live measurement could not run (no model, swarm composed otherwise than expected, no namespace)."""


@dataclass(frozen=True)
class DowntimeRow:
    """One migration: link, session length, mode, its wall time, the extra gap it caused, when the old cache
    was free again, and the KV bytes of the session on the whole chain."""

    link: str
    tokens: int
    position: int
    mode: str
    direction: str
    migrate_s: float
    gap_s: float
    normal_gap_s: float
    downtime_s: float
    freed_s: float
    kv_bytes: int


def kv_bytes_per_token(config: Any) -> int:
    """Keys + values of one token over every block, in the served dtype (float32 here)."""
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_key_value_heads * head_dim * 4 * config.num_hidden_layers


def server_plans(sizes: Any) -> list[Any]:
    """A server for all blocks and two for half of them each, every one with room for exactly one session."""
    from petals_chain.loopback.swarm import ServerPlan

    n = sizes.num_blocks
    half = n // 2
    whole = n * (sizes.block_bytes + sizes.cache_bytes) * 1.001
    first = half * (sizes.block_bytes + sizes.cache_bytes) * 1.001
    second = (n - half) * (sizes.block_bytes + sizes.cache_bytes) * 1.001
    # Announced per-block times (not measured, nothing is slowed down) that make GBP-CR place the whole-model server
    # first whatever the round trips measured on a busy machine: chains [whole] and [first, second].
    return [ServerPlan("whole", f"{whole:.0f}", ("--tau-p", "20ms")),
            ServerPlan("first", f"{first:.0f}", ("--tau-p", "60ms")),
            ServerPlan("second", f"{second:.0f}", ("--tau-p", "60ms"))]


def _chains(sw: Any) -> tuple[list[Any], list[Any]]:
    """(one-hop chain, multi-hop chain) as Hops, from the orchestrator's chains and servers."""
    from petals_chain.protocol.hop import Hop

    peers = {r["name"]: r["peer_id"] for r in sw.get("/servers")["servers"]}
    chains = [[Hop(s["server"], s["start"], s["end"], peers[s["server"]]) for s in c["spans"]]
              for c in sw.get("/chains")["chains"]]
    one = [c for c in chains if len(c) == 1]
    many = [c for c in chains if len(c) >= 2]
    if not one or not many:
        raise LiveBenchError(f"expected a one-server chain and a multi-server chain, got {chains}")
    return one[0], many[0]


class _Greedy:
    """Greedy decoding driven step by step through a petals inference session (times every token)."""

    def __init__(self, model: Any, session: Any) -> None:
        self.model, self.session = model, session
        self.stamps: list[float] = []

    def feed(self, ids: np.ndarray) -> int:
        """Send tokens through the session; the greedy next token."""
        import torch

        with torch.inference_mode():
            x = self.model.transformer.word_embeddings(torch.as_tensor(ids, dtype=torch.long)[None])
            h = self.session.step(x)
            logits = self.model.lm_head(self.model.transformer.ln_f(h[:, -1:]))
        self.stamps.append(time.perf_counter())
        return int(logits[0, -1].argmax())

    def generate(self, first: int, n: int) -> int:
        """n greedy steps starting from token ``first``; the last token produced."""
        tok = first
        for _ in range(n):
            tok = self.feed(np.array([tok]))
        return tok


def _wait_free(session: Any, peers: list[str], baseline: dict[str, int], cap_s: float = 30.0) -> float:
    """Seconds until every peer in ``peers`` reports its baseline cache room again (polled every 10 ms)."""
    from petals_chain.client.kv_migrate import cache_tokens_left

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < cap_s:
        if all(cache_tokens_left(session, p) >= baseline[p] for p in peers):
            return time.perf_counter() - t0
        time.sleep(0.01)
    return float("nan")


def _migrate_and_time(g: _Greedy, tok: int, target: list[Any], mode: str, link: str, nominal: int, direction: str,
                      baseline: dict[str, int], per_token: int) -> tuple[DowntimeRow, int]:
    """Generate, migrate, generate; the row for this migration and the last token."""
    from petals_chain.client.kv_migrate import hops_of, migrate

    tok = g.generate(tok, GEN_TOKENS)
    before = g.stamps[-GEN_TOKENS:]
    old = [h[0] for h in hops_of(g.session)]
    position = g.session.position
    rec = migrate(g.session, target, mode)
    freed = _wait_free(g.session, old, baseline)
    t_mig_end = time.perf_counter()
    tok = g.generate(tok, GEN_TOKENS)
    after = g.stamps[-GEN_TOKENS:]
    normal = statistics.median(np.diff(before).tolist() + np.diff(after).tolist())
    gap = after[0] - before[-1] - (t_mig_end - before[-1] - rec.seconds)  # leave out our own polling for `freed`
    row = DowntimeRow(link, nominal, position, mode, direction, rec.seconds, gap, normal, gap - normal, freed,
                      position * per_token)
    return row, tok


def measure(lengths: tuple[int, ...], link: str, log_dir: Path, seed: int = 0,
            model_dir: Path = MODEL_DIR, progress: bool = True) -> list[DowntimeRow]:
    """Start the swarm, grow one session through ``lengths`` and migrate it both ways at each; stop the swarm."""
    import petals

    from petals_chain.checkpoint.sizing import block_sizes
    from petals_chain.client.kv_migrate import cache_tokens_left, migrate, open_route
    from petals_chain.loopback.swarm import LocalSwarm

    if not (model_dir / "model.safetensors").is_file():
        raise LiveBenchError(f"{model_dir} has no checkpoint: run scripts/prepare_model.sh first")
    sizes = block_sizes(model_dir, "float32", MAX_LENGTH)
    rows: list[DowntimeRow] = []
    with LocalSwarm(model_dir, server_plans(sizes), log_dir=log_dir, model_name="smollm2-kv", max_length=MAX_LENGTH,
                    arrival_rate=4.0, c=1, lease_ttl_s=60.0, heartbeat_timeout_s=60.0) as sw:
        sw.start(timeout_s=600)
        one, many = _chains(sw)
        dht = sw.get("/health")["dht"]
        # Long prefills on busy CPU servers: no step timeout, and no silent petals retry that would re-route the
        # session (a failure must show).
        model = petals.AutoDistributedModelForCausalLM.from_pretrained(
            str(model_dir), initial_peers=dht["initial_peers"], dht_prefix=dht["dht_prefix"],
            inference_step_timeout=STEP_TIMEOUT_S, request_timeout=STEP_TIMEOUT_S, max_retries=1)
        manager = model.transformer.h.sequence_manager
        try:
            baseline = {h.peer_id: cache_tokens_left(manager, h.peer_id) for h in one + many}
            per_token = kv_bytes_per_token(model.config)
            ids = np.random.default_rng(seed).integers(3, model.config.vocab_size, MAX_LENGTH)
            room = 4 * GEN_TOKENS + 1  # tokens generated around the two migrations of the last length
            with model.transformer.h.inference_session(max_length=MAX_LENGTH) as sess:
                open_route(sess, one)
                g = _Greedy(model, sess)
                tok = g.feed(ids[:GEN_TOKENS])
                for dst in (many, one):  # warm-up, not reported: the first connections between these peers
                    migrate(sess, dst, "kv")
                for nominal in sorted(lengths):
                    target = min(nominal, MAX_LENGTH - room)
                    chunk = ids[sess.position: max(sess.position + 1, target - GEN_TOKENS)]
                    tok = g.feed(chunk)
                    for mode, dst, direction in (("kv", many, "1 -> 2 servers"), ("replay", one, "2 -> 1 server")):
                        row, tok = _migrate_and_time(g, tok, dst, mode, link, nominal, direction, baseline,
                                                     per_token)
                        rows.append(row)
                        if progress:
                            print(f"  [{link}] {nominal:>5} tokens {mode:>6}: migrate {row.migrate_s:.3f} s, "
                                  f"downtime {row.downtime_s:.3f} s, old cache free after {row.freed_s:.3f} s",
                                  flush=True)
        finally:
            manager.shutdown()
    return rows


# ---- bandwidth cap: the same measurement inside a network namespace ------------------------------------------


def _ip(*args: str) -> None:
    """Run an ``ip``/``tc`` command; LiveBenchError with its message if it fails."""
    out = subprocess.run(list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise LiveBenchError(f"{' '.join(args)}: {out.stderr.strip()}")


def measure_capped(lengths: tuple[int, ...], cap_mbit: float, log_dir: Path, seed: int = 0) -> list[DowntimeRow]:
    """``measure`` in a fresh network namespace whose loopback is shaped by ``tc tbf`` at ``cap_mbit``."""
    if os.geteuid() != 0:
        raise LiveBenchError("the bandwidth cap needs root (a network namespace and tc)")
    ns = f"pc-kv-{os.getpid()}"
    _ip("ip", "netns", "add", ns)
    try:
        _ip("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        _ip("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{cap_mbit}mbit",
            "burst", "256kb", "latency", "100ms")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "petals_chain.experiments.mell_live",
                   "--lengths", ",".join(map(str, lengths)), "--link", f"tbf {cap_mbit:g} Mbit/s",
                   "--log-dir", str(log_dir), "--seed", str(seed), "--json-out", str(out)]
            done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)))
            if done.returncode != 0 or not out.is_file():
                raise LiveBenchError(f"the capped measurement failed (exit {done.returncode}); logs in {log_dir}")
            return [DowntimeRow(**r) for r in json.loads(out.read_text())]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ---- the adaptive division against the measurements ---------------------------------------------------------


def division_check(rows: list[DowntimeRow], transfer_limit_s: float = 2.0,
                   prefill_limit_s: float = 0.5) -> list[dict[str, Any]]:
    """Per link and length: the mode that was faster, and the mode ``hybrid_divide`` picks for that one move with
    budgets from this link's measured bandwidth and prefill rate (the largest session's transfer and replay):
    once with the simulator's epoch limits (docs/mell.md, "Simulator"), once with an epoch long enough for both
    modes of that move (so the rule, not the budget, decides). The ``fastest`` rule estimates each mode's time
    from this link's profile (:func:`~petals_chain.mell.hybrid.profile_speeds` of its shortest and longest
    session's downtimes)."""
    from petals_chain.mell.hybrid import RULES, Budgets, hybrid_divide, machine_path, profile_speeds
    from petals_chain.mell.state import Move

    def picks(move: list[Move], per_token: int, link_bytes: float, prefill_tokens: int, speeds) -> dict[str, str]:
        """Every rule's pick for one move under these budgets."""
        budgets = Budgets({}, {}, default_link_bytes=link_bytes, default_prefill_tokens=prefill_tokens)
        return {rule: hybrid_divide(move, per_token, budgets, machine_path(1), rule, speeds).modes[0].value
                for rule in RULES}

    out = []
    for link in sorted({r.link for r in rows}):
        mine = [r for r in rows if r.link == link]
        kv = {r.tokens: r for r in mine if r.mode == "kv"}
        rp = {r.tokens: r for r in mine if r.mode == "replay"}
        big = max(kv)
        bw = kv[big].kv_bytes / kv[big].migrate_s
        rate = rp[big].position / rp[big].migrate_s
        per_token = kv[big].kv_bytes // kv[big].position
        ends = (min(kv), big)
        speeds = profile_speeds([(kv[n].kv_bytes, kv[n].downtime_s) for n in ends],
                                [(rp[n].position, rp[n].downtime_s) for n in ends])
        for n in sorted(kv):
            faster = "kv" if kv[n].downtime_s <= rp[n].downtime_s else "token"
            move = [Move(0, 0, 1, kv[n].position)]
            sim = picks(move, per_token, bw * transfer_limit_s, int(rate * prefill_limit_s), speeds)
            epoch = 1.01 * max(kv[n].position * per_token / bw, kv[n].position / rate)
            both = picks(move, per_token, bw * epoch, int(rate * epoch), speeds)
            out.append({"link": link, "tokens": n, "bandwidth_MBps": bw / 1e6, "prefill_tok_s": rate,
                        "kv_downtime_s": kv[n].downtime_s, "replay_downtime_s": rp[n].downtime_s, "faster": faster,
                        "first_fit": sim["first"], "best_fit": sim["best"], "fastest": sim["fastest"],
                        "first_fit_both": both["first"], "best_fit_both": both["best"],
                        "fastest_both": both["fastest"],
                        "kv_estimate_s": speeds.kv_s(("move",), kv[n].position * per_token),
                        "replay_estimate_s": speeds.token_s(1, kv[n].position),
                        "profile": {"link_MBps": speeds.default_link_bytes_per_s / 1e6,
                                    "kv_setup_s": speeds.kv_setup_s,
                                    "prefill_tok_s": speeds.default_prefill_tokens_per_s,
                                    "prefill_doubling_tokens": speeds.prefill_doubling_tokens}})
    return out


def table(rows: list[DowntimeRow]) -> str:
    """The downtime table as text."""
    lines = [f"{'link':>16} {'tokens':>6} {'mode':>6} {'direction':>15} {'migrate s':>9} {'downtime s':>10} "
             f"{'gap s':>7} {'freed s':>7} {'KV MB':>7}"]
    for r in rows:
        lines.append(f"{r.link:>16} {r.tokens:>6} {r.mode:>6} {r.direction:>15} {r.migrate_s:>9.3f} "
                     f"{r.downtime_s:>10.3f} {r.gap_s:>7.3f} {r.freed_s:>7.3f} {r.kv_bytes / 1e6:>7.1f}")
    return "\n".join(lines)


def _main(argv: list[str] | None = None) -> int:
    """Worker entry (run inside the namespace by measure_capped): measure and write the rows as JSON."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m petals_chain.experiments.mell_live")
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--link", required=True)
    ap.add_argument("--log-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = measure(tuple(int(x) for x in args.lengths.split(",")), args.link, args.log_dir, args.seed)
    args.json_out.write_text(json.dumps([asdict(r) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
