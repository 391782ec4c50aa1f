"""``python -m petals_chain.bench server``: decoding tokens/s of live batching servers vs PETALS' pool, end to end
and inside the server, beside the bare batched forward measured in the same run.

A loopback swarm of SmolLM2-135M (float32, CPU, one torch thread per server) runs its 30 blocks on two servers of
15 (``--layout two-15``: every step visits both, a chain of two) or one server of 30 (``one-30``), twice in the
same run: with batching (the default options) and with ``--max-batch-sessions 1`` (PETALS' one-session-at-a-time
pool). ``--rtt-ms`` puts a round trip in front of each server (a delaying relay, as the emulated testbed's: the
client and the other server reach it only through it), so a chain of two pays its network as a real one does. For
every context C (tokens in each session's cache at the end) and b concurrent sessions, each holding its
lease, all start together: a prompt of C − new tokens, then ``--new-tokens`` steps of one token (by default
hidden states: the servers' work, without the client's LM head and sampling, which here would share the servers'
two cores; ``--client generate`` runs greedy ``generate()`` instead). Three figures:

* end to end: b × new tokens / wall time from the common start to the last end (RPC and client included; with
  ``--client hidden`` the clock starts once every session has its prompt in the cache, with ``generate`` before);
* inside the server: Σ sessions / Σ seconds over the decode batches every server ran (``--step-log``: the
  seconds of the batched step itself, no queueing or RPC), per server, for the batching swarm;
* the bare forward inside the server (``--bare-probe-every N``, default 4): after every N-th decode batch the
  server's runtime thread runs the bare batched forward of its blocks over as many sessions at their mean context
  with preallocated caches (server/bare_probe.py) and logs it beside the step: in/bare is then a paired ratio, both
  sides timed in the same thread of the same process moments apart (mean of the per-batch ratios, 95 % interval);
* in process, in the same run: one decode step of b sessions over the same span at context C, PETALS'
  ``_MergedInferenceStep`` one session after another (what its pool computes: its tokens/s inside the server at
  any b) and the bare batched forward with preallocated caches (the limit), from ``bench server-step``.

The ratios printed are batched / PETALS inside the server, and inside the server / bare forward (in process and in
the server). The load average
is printed before and after: the machine is shared, so the absolute figures are noisy and the ratios the result.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from petals_chain.experiments.common import REPO

MODEL_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
LAYOUTS = {"two-15": 2, "one-30": 1}
BLOCK_BYTES = 14.16e6  # one SmolLM2-135M block, float32
CACHE_BYTES_PER_TOKEN = 2 * 3 * 64 * 4  # keys and values of 3 KV heads of 64, float32, per block


def _sessions_tps(model, prompt: torch.Tensor, b: int, new_tokens: int, client: str) -> float:
    """Aggregate tokens/s of ``b`` concurrent sessions started together (each already leased): greedy ``generate``
    from the common start (``client`` "generate": prefill included), or, after every session's prompt, ``new_tokens``
    decode steps of one random hidden state each timed from a common start ("hidden": the servers' decoding without
    the client's embedding, LM head and sampling, which on this machine would share the servers' cores)."""
    barrier = threading.Barrier(b)
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []
    hidden = model.config.hidden_size

    def one(k: int) -> None:
        """One session: lease, wait for the others, decode."""
        try:
            with torch.no_grad(), model.inference_session(max_length=prompt.shape[1] + new_tokens + 1) as s:
                gen = torch.Generator().manual_seed(k)
                steps = [torch.randn(1, 1, hidden, generator=gen) for _ in range(new_tokens)]
                if client == "hidden":  # the prompt first, then the decode steps timed from a common start
                    s.step(model.transformer.word_embeddings(prompt))
                    barrier.wait(1200)
                    t0 = time.perf_counter()
                    for x in steps:
                        s.step(x)
                else:
                    barrier.wait(1200)
                    t0 = time.perf_counter()
                    model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, session=s)
                spans.append((t0, time.perf_counter()))
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    if errors:
        raise RuntimeError(f"a session failed: {errors[0]!r}")
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return b * new_tokens / wall


def _swarm_figures(window_ms: float | None, layout: str, contexts: Sequence[int], sessions: Sequence[int],
                   new_tokens: int, client: str, log_dir: Path, max_batch: int, pin: bool = False,
                   rtt_s: Sequence[float] = (), probe_every: int = 0) -> dict:
    """Start the swarm (batching with this window, or PETALS' pool for None) and measure every (context, b); the swarm
    is stopped after; ``rtt_s`` puts a delaying relay with that round trip in front of each server. Returns
    {"e2e": {(ctx, b): tokens/s}, "per_step": {(ctx, b): mean sessions per decode step, the smaller of the
    servers'}, "rows": {ctx: [(server, sessions, seconds, bare seconds or None) of every decode batch]},
    "blocks": {server: blocks it serves}}."""
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.launch.profile_fit import read_step_log
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan

    n_servers = LAYOUTS[layout]
    blocks = 30 // n_servers
    max_length = max(contexts) + 2
    budget = blocks * BLOCK_BYTES + max(sessions) * max_length * CACHE_BYTES_PER_TOKEN * blocks
    budget_mb = math.ceil(budget / 1e6 * 1.15) + 20
    logs = {f"s{k}": log_dir / f"steps-s{k}.csv" for k in range(n_servers)}
    cpus = sorted(os.sched_getaffinity(0))
    pinning = ("--runtime-cpus", str(cpus[0])) if pin else ()
    rtts = list(rtt_s) or [0.0] * n_servers
    plans = [ServerPlan(name, f"{budget_mb}MB", (*pinning, "--max-batch-sessions", "1") if window_ms is None else
                        (*pinning, "--step-log", str(path), "--batch-window-ms", repr(window_ms),
                         "--max-batch-sessions", str(max_batch), "--bare-probe-every", str(probe_every)), rtt_s=rtt)
             for (name, path), rtt in zip(logs.items(), rtts)]
    out: dict = {"e2e": {}, "per_step": {}, "rows": {}, "blocks": {}}
    gen = torch.Generator().manual_seed(0)
    label = "petals pool" if window_ms is None else f"batched, window {window_ms:g} ms"
    with LocalSwarm(MODEL_DIR, plans, log_dir=log_dir, model_name="SmolLM2-135M-Instruct", max_length=max_length,
                    arrival_rate=0.2, c=max(sessions), job_input_tokens=max(contexts) - new_tokens,
                    job_output_tokens=new_tokens) as sw:
        sw.start(timeout_s=900)
        if pin:  # the client (this process) off the runtime's CPU, as the servers' own other threads are
            os.sched_setaffinity(0, cpus[1:])
        for chain in sw.get("/chains")["chains"]:
            for hop in chain["spans"]:
                out["blocks"][hop["server"]] = hop["end"] - hop["start"]
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL_DIR), orchestrator=sw.url,
                                                               lease_timeout_s=1200.0)
        try:
            _sessions_tps(model, torch.randint(100, 40000, (1, 8), generator=gen), 1, 2, client)  # warm-up
            for ctx in contexts:
                prompt = torch.randint(100, 40000, (1, ctx - new_tokens), generator=gen)
                out["rows"][ctx] = []
                for b in sessions:
                    seen = {n: len(read_step_log(p)) if p.exists() else 0 for n, p in logs.items()}
                    out["e2e"][(ctx, b)] = _sessions_tps(model, prompt, b, new_tokens, client)
                    means = []
                    for name, path in logs.items():
                        rows = read_step_log(path)[seen[name]:] if path.exists() else []
                        decode = [(name, r.sessions, r.seconds, r.bare_seconds) for r in rows
                                  if r.tokens == r.sessions]
                        out["rows"][ctx] += decode
                        if decode:
                            means.append(sum(r[1] for r in decode) / len(decode))
                    out["per_step"][(ctx, b)] = min(means) if means else 1.0
                    print(f"  {label}: ctx={ctx} b={b}: end to end {out['e2e'][(ctx, b)]:.1f} tokens/s, "
                          f"{out['per_step'][(ctx, b)]:.2f} sessions per decode step", flush=True)
        finally:
            close_client(model)
            if pin:
                os.sched_setaffinity(0, cpus)
    return out


def _inside_table(rows: Sequence[tuple[str, int, float, float | None]], blocks: dict[str, int],
                  step: dict[tuple[int, int, int], dict[str, float]], ctx: int, mid: int) -> list[str]:
    """Per server and number of sessions k its decode batches had: steps seen, tokens/s inside the server
    (k / median seconds), the bare forward's and PETALS' step's in process at k, and the ratios; then the bare
    forward the server probed itself: batches probed and the mean of their paired in/bare ratios (± its 95 %
    half-width)."""
    import numpy as np

    from petals_chain.experiments.common import mean_ci

    lines = []
    for name in sorted(blocks):
        by_k: dict[int, list[float]] = {}
        paired: dict[int, list[float]] = {}
        for server, k, sec, bare in rows:
            if server == name:
                by_k.setdefault(k, []).append(sec)
                if bare is not None:
                    paired.setdefault(k, []).append(bare / sec)
        for k in sorted(by_k):
            ref = step.get((blocks[name], mid, k))
            inside = k / float(np.median(by_k[k]))
            tail = (f"{ref['c']:>7.1f} {ref['a']:>11.1f} | {inside / ref['c']:>7.2f} {inside / ref['a']:>9.2f}"
                    if ref else f"{'-':>7} {'-':>11} | {'-':>7} {'-':>9}")
            mean, half = mean_ci(paired.get(k, []))
            probed = (f"{len(paired.get(k, [])):>6} {mean:>7.2f} ± {half:<5.2f}" if paired.get(k) else
                      f"{0:>6} {'-':>7}   {'-':<5}")
            lines.append(f"{ctx:>5} {name:>6} {blocks[name]:>6} {k:>3} {len(by_k[k]):>6} | {inside:>7.1f} | {tail} |"
                         f" {probed}")
    return lines


BANDS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 10**6))  # k bands of the pooled in-server probe line


def _probe_bands(rows: Sequence[tuple[str, int, float, float | None]]) -> str:
    """The in-server probe pooled over bands of k (few batches of each large k are probed): per band with a probed
    batch, 'k lo–hi: n, mean ± 95 %' of the paired bare/step ratios."""
    from petals_chain.experiments.common import mean_ci

    cells = []
    for lo, hi in BANDS:
        ratios = [bare / sec for _, k, sec, bare in rows if bare is not None and lo <= k <= hi]
        if ratios:
            mean, half = mean_ci(ratios)
            band = f"k {lo}" if lo == hi else f"k {lo}-{hi}"
            cells.append(f"{band}: {len(ratios)} batches, {mean:.2f} ± {half:.2f}")
    return "; ".join(cells) if cells else "no batch probed"


def run(argv: list[str] | None = None) -> int:
    """Print the live figures and the same run's in-process baseline; returns 0."""
    from petals_chain import defaults
    from petals_chain.bench.server_step import step_figures

    p = argparse.ArgumentParser(prog="python -m petals_chain.bench server", description=__doc__.splitlines()[0])
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="two-15",
                   help="two servers of 15 blocks (a chain of two) or one of 30 (default two-15)")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024],
                   help="tokens in each session's cache at the end (default 128 1024)")
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="b, concurrent sessions")
    p.add_argument("--new-tokens", type=int, default=24, help="decode steps per session (default 24)")
    p.add_argument("--windows-ms", type=float, nargs="+", default=[defaults.BATCH_WINDOW_S * 1e3],
                   help="batching windows to run (ms; the first is the one measured inside the server)")
    p.add_argument("--client", choices=("hidden", "generate"), default="hidden",
                   help="sessions step hidden states (the servers' work; default) or run greedy generate()")
    p.add_argument("--max-batch-sessions", type=int, default=defaults.MAX_BATCH_SESSIONS,
                   help=f"the batching servers' --max-batch-sessions (default {defaults.MAX_BATCH_SESSIONS})")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per in-process figure (their median is kept, as"
                                                          " inside the server)")
    p.add_argument("--rtt-ms", type=float, nargs="+", default=[],
                   help="a round trip (ms) added in front of each server, one per server of the layout (a delaying "
                        "relay, as the testbed's; e.g. 24.78 25.09, the RIPE Atlas RTTs of the emulated testbed's "
                        "first two servers); default none, plain loopback")
    p.add_argument("--bare-probe-every", type=int, default=4, metavar="N",
                   help="the batching servers time the bare forward after every N-th decode batch (their "
                        "--bare-probe-every; 0: not at all); default 4")
    p.add_argument("--pin", action="store_true",
                   help="each server's runtime thread alone on the first CPU (--runtime-cpus), everything else (its "
                        "handlers, the client) on the others: inside-server times without the RPC work's contention")
    args = p.parse_args(argv)
    if not (MODEL_DIR / "model.safetensors").is_file():
        print(f"error: {MODEL_DIR} is missing: run scripts/prepare_model.sh")
        return 2
    if min(args.contexts) <= args.new_tokens or min(args.sessions) < 1 or args.new_tokens < 2:
        print("error: every context must exceed --new-tokens (>= 2), and --sessions must be >= 1")
        return 2
    if min(args.windows_ms) < 0:
        print("error: --windows-ms must be >= 0")
        return 2
    if args.bare_probe_every < 0:
        print("error: --bare-probe-every must be >= 0 (0: no probe)")
        return 2
    if args.rtt_ms and (len(args.rtt_ms) != LAYOUTS[args.layout] or min(args.rtt_ms) < 0):
        print(f"error: --rtt-ms needs {LAYOUTS[args.layout]} round trips >= 0 for layout {args.layout}, got "
              f"{' '.join(map(format, args.rtt_ms))}")
        return 2
    rtt_s = [r / 1e3 for r in args.rtt_ms]
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        print("error: --pin needs at least 2 CPUs")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        runs = {w: _swarm_figures(w, args.layout, args.contexts, args.sessions, args.new_tokens, args.client,
                                  Path(tmp) / f"batched-{w:g}", args.max_batch_sessions, args.pin, rtt_s,
                                  args.bare_probe_every)
                for w in args.windows_ms}
        petals = _swarm_figures(None, args.layout, args.contexts, args.sessions, args.new_tokens, args.client,
                                Path(tmp) / "petals", 1, args.pin, rtt_s)
    load_live = os.getloadavg()
    first = runs[args.windows_ms[0]]
    spans = sorted(set(first["blocks"].values()))
    mid = [c - args.new_tokens // 2 for c in args.contexts]  # the decode steps' mean context
    step = step_figures(spans, mid, sorted(set(args.sessions) | set(range(1, max(args.sessions) + 1))),
                        repeat=args.repeat, median=True)
    spans_text = ", ".join(f"{n} {m} blocks" for n, m in sorted(first["blocks"].items()))
    pinned = f", runtime threads on CPU {min(os.sched_getaffinity(0))} alone" if args.pin else ""
    if rtt_s:
        pinned += f", round trips {' + '.join(format(r, 'g') for r in args.rtt_ms)} ms in front of the servers"
    print(f"\nSmolLM2-135M float32, layout {args.layout} ({spans_text}; 1 torch thread each), {args.new_tokens} decode "
          f"steps per session, client {args.client}, --max-batch-sessions {args.max_batch_sessions}{pinned}")
    print("end to end through the swarm: tokens/s summed over sessions (mean sessions per decode step)")
    head = "".join(f" {'window ' + format(w, 'g') + ' ms':>22}" for w in args.windows_ms)
    print(f"{'ctx':>5} {'b':>3} | {'petals pool':>11} |{head} | ratio to the petals pool")
    for ctx in args.contexts:
        for b in args.sessions:
            ref = petals["e2e"][(ctx, b)]
            cells = "".join(f" {r['e2e'][(ctx, b)]:>13.1f} ({r['per_step'][(ctx, b)]:>5.2f})" for r in runs.values())
            ratios = " ".join(f"{r['e2e'][(ctx, b)] / ref:.2f}" for r in runs.values())
            print(f"{ctx:>5} {b:>3} | {ref:>11.1f} |{cells} | {ratios}")
    if rtt_s:
        print("one session's decode step end to end (ms; b = 1), round trips in front of the servers summing to "
              f"{sum(args.rtt_ms):g} ms: " + "; ".join(
                  f"ctx {ctx}: petals pool {1e3 / petals['e2e'][(ctx, 1)]:.1f}, "
                  + ", ".join(f"window {w:g} ms {1e3 / r['e2e'][(ctx, 1)]:.1f}" for w, r in runs.items())
                  for ctx in args.contexts if (ctx, 1) in petals["e2e"]))
    print(f"\ninside the server (window {args.windows_ms[0]:g} ms): every decode batch of k sessions the servers ran, "
          "tokens/s = k / median step time; bare forward and PETALS' step in process (median of --repeat calls), same "
          "blocks and mean context, this run (PETALS' pool runs one session at a time: its tokens/s inside the server "
          f"at every b); then the bare forward probed by the server itself after every {args.bare_probe_every}-th "
          "decode batch: batches probed, in/bare = mean of the paired per-batch ratios (bare s / step s) ± 95 %")
    print(f"{'ctx':>5} {'server':>6} {'blocks':>6} {'k':>3} {'steps':>6} | {'inside':>7} | {'bare':>7} "
          f"{'PETALS step':>11} | {'in/bare':>7} {'in/PETALS':>9} | {'probed':>6} {'in/bare in server':>17}")
    for ctx, m in zip(args.contexts, mid):
        for line in _inside_table(first["rows"][ctx], first["blocks"], step, ctx, m):
            print(line)
    for ctx in args.contexts:
        print(f"in/bare in server, pooled by k (ctx {ctx}): {_probe_bands(first['rows'][ctx])}")
    print(f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, after the live runs "
          f"{tuple(round(x, 2) for x in load_live)}, at the end {tuple(round(x, 2) for x in os.getloadavg())}")
    return 0
