"""``python -m petals_chain.bench server``: aggregate decoding tokens/s of live batching servers vs PETALS' pool.

A loopback swarm of SmolLM2-135M (float32, CPU) on two servers of 15 blocks each (the model's 30 blocks do not fit
one server's budget here, so every step visits both; each server is one 15-block server of the issue) is started
twice in the same run: with batching (the default options) and with ``--max-batch-sessions 1`` (PETALS'
one-session-at-a-time pool). For b = 1, 2, 4, 8 concurrent sessions, each holding its lease first, all start
together and decode ``--new-tokens`` greedy tokens after a prompt of about ``--prompt-tokens``; aggregate tokens/s
= b × new tokens / wall time from the common start to the last session's end (prefill, RPC and client included).
The in-process figures of ``bench server-step`` for the same span follow, and the load average is printed before
and after: the machine is shared, so absolute figures are noisy and the ratios are the result.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import threading
import time
from pathlib import Path

import torch

from petals_chain.experiments.common import REPO

MODEL_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"


def _sessions_tps(model, prompt: torch.Tensor, b: int, new_tokens: int) -> float:
    """Aggregate tokens/s of ``b`` concurrent greedy sessions started together (each already leased)."""
    barrier = threading.Barrier(b)
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        """One session: lease, wait for the others, decode."""
        try:
            with model.inference_session(max_length=prompt.shape[1] + new_tokens + 1) as s:
                barrier.wait(300)
                t0 = time.perf_counter()
                model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, session=s)
                spans.append((t0, time.perf_counter()))
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    if errors:
        raise RuntimeError(f"a session failed: {errors[0]!r}")
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return b * new_tokens / wall


def _swarm_figures(batched: bool, sessions: list[int], prompt: torch.Tensor, new_tokens: int,
                   log_dir: Path) -> dict[int, float]:
    """Start the two-server swarm (batched or PETALS' pool) and measure every b; the swarm is stopped after."""
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client
    from petals_chain.loopback.swarm import LocalSwarm, ServerPlan
    from petals_chain.server.batching import BATCH_LOG_PREFIX

    extra = () if batched else ("--max-batch-sessions", "1")
    plans = [ServerPlan("a", "300MB", extra), ServerPlan("b", "300MB", extra)]
    out = {}
    with LocalSwarm(MODEL_DIR, plans, log_dir=log_dir, model_name="SmolLM2-135M-Instruct", max_length=256,
                    arrival_rate=0.2, c=max(sessions)) as sw:
        sw.start(timeout_s=600)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(MODEL_DIR), orchestrator=sw.url,
                                                               lease_timeout_s=600.0)
        try:
            _sessions_tps(model, prompt, 1, 2)  # warm-up: connections, first allocations
            for b in sessions:
                out[b] = _sessions_tps(model, prompt, b, new_tokens)
                print(f"  {'batched' if batched else 'petals '} b={b}: {out[b]:.1f} tokens/s", flush=True)
        finally:
            close_client(model)
        if batched:
            most = max([1, *(int(m.group(1)) for proc in sw.procs for m in re.finditer(
                re.escape(BATCH_LOG_PREFIX) + r" (\d+) sessions", proc.log_path.read_text(errors="replace")))])
            print(f"  largest batched step the servers logged: {most} sessions", flush=True)
    return out


def run(argv: list[str] | None = None) -> int:
    """Print the live table, then the in-process one; returns 0."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench server", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8], help="b, concurrent sessions")
    p.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of every session (default 32)")
    p.add_argument("--new-tokens", type=int, default=24, help="greedy tokens per session (default 24)")
    p.add_argument("--no-in-process", action="store_true", help="skip bench server-step's figures")
    args = p.parse_args(argv)
    if not (MODEL_DIR / "model.safetensors").is_file():
        print(f"error: {MODEL_DIR} is missing: run scripts/prepare_model.sh")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_before = os.getloadavg()
    prompt = torch.randint(100, 40000, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        batched = _swarm_figures(True, args.sessions, prompt, args.new_tokens, Path(tmp) / "batched")
        petals = _swarm_figures(False, args.sessions, prompt, args.new_tokens, Path(tmp) / "petals")
    load_after = os.getloadavg()
    print(f"\nlive: SmolLM2-135M float32 on two 15-block servers (1 torch thread each), prompt {args.prompt_tokens},"
          f" {args.new_tokens} new tokens per session; aggregate tokens/s")
    print(f"{'b':>3} | {'petals pool':>11} {'batched':>9} | {'ratio':>5}")
    for b in args.sessions:
        print(f"{b:>3} | {petals[b]:>11.1f} {batched[b]:>9.1f} | {batched[b] / petals[b]:>5.2f}")
    print(f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, after the live runs"
          f" {tuple(round(x, 2) for x in load_after)}", flush=True)
    if not args.no_in_process:
        from petals_chain.bench import server_step

        print("\nin process (bench server-step, the same span, no RPC):", flush=True)
        server_step.run(["--blocks", "15", "--contexts", str(args.prompt_tokens + args.new_tokens), "--sessions",
                         *map(str, args.sessions), "--quick", "--no-alternatives"])
        print(f"load average after everything {tuple(round(x, 2) for x in os.getloadavg())}")
    return 0
