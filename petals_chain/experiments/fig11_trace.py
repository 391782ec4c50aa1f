"""Fig. 11: how far the Azure 2023 code trace is from the analysis' assumptions (Poisson arrivals, exponential
service times).

Inter-arrival times of the whole trace, and each request's service time on every chain of the paper's
LLaMA-2-7B testbed (the composition the default method forms there, service times from the token-aware
model of docs/model.md, "Service time"), each set against an exponential law with the same mean. The figure
the paper quotes is the std ratio (std of the data / std of that exponential = std / mean): 13.15 for the
inter-arrivals, 0.71-0.81 for the service times. Output: fig11.csv (one row per series), fig11.png (CCDFs,
log scale).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from petals_chain.compose.method_table import METHODS
from petals_chain.data import data_dir
from petals_chain.data.azure import Trace, read_azure_trace
from petals_chain.data.ripe import draw_topology
from petals_chain.experiments.common import Summary, plt, read_csv, write_csv
from petals_chain.model import ModelSpec, ServerSpec
from petals_chain.model_shapes import KNOWN_SHAPES, paper_testbed_sizes
from petals_chain.service_time import PAPER_DEVICES, Workload, tau_c, tau_p
from petals_chain.sim.network import chain_token_model

TRACE_FILE = "azure_llm_2023_code.csv"
# The committed live replays (Table 1): their requests' measured service times, the largest in-regime one first.
LIVE_REPLAYS = ("table1-x9-batched/table1_requests.csv", "table1-x9/table1_requests.csv",
                "table1-full/table1_requests.csv", "table1_requests.csv")
TESTBED_KINDS = ("a100-3g.40gb",) * 3 + ("a100-2g.20gb",) * 6  # the paper's 9 MIG slices
TESTBED_SEED = 7  # the RTT draw of the shipped LLaMA-2-7B testbed cluster file
PAPER_INTERARRIVAL_RATIO = 13.15
PAPER_SERVICE_RATIO = (0.71, 0.81)


def std_ratio(x: np.ndarray) -> float:
    """std of ``x`` over the std of an exponential law with the same mean (= the coefficient of variation)."""
    x = np.asarray(x, dtype=np.float64)
    return float(x.std() / x.mean())


def chains_on_testbed(trace: Trace) -> tuple[list[Any], np.ndarray, Any]:
    """The default composition of the paper's testbed at the trace's rate, every request's service time on
    each of its chains (shape (n, K)) and the chains' token model."""
    block_bytes, cache_bytes = paper_testbed_sizes()
    model = ModelSpec(KNOWN_SHAPES["llama-2-7b"].layers, float(block_bytes), float(cache_bytes), "llama-2-7b")
    work = Workload(int(round(trace.input_tokens.mean())), int(round(trace.output_tokens.mean())),
                    block_bytes)  # 2 FLOP per fp16 parameter = s_m bytes of FLOP per block and token
    rtts = draw_topology(len(TESTBED_KINDS), np.random.default_rng(TESTBED_SEED)).server_rtt_s
    kinds = [PAPER_DEVICES[k] for k in TESTBED_KINDS]
    servers = [ServerSpec(f"s{j}", kind.memory_bytes, tau_c(float(rtt), work), tau_p(kind, block_bytes, work))
               for j, (kind, rtt) in enumerate(zip(kinds, rtts))]
    span_s = float(trace.arrival_s[-1] - trace.arrival_s[0])
    rate = (trace.arrival_s.size - 1) / span_s
    comp = METHODS["proposed"].compose(servers, model, rate)
    tokens = chain_token_model(comp.chains, rtts, kinds, block_bytes=block_bytes, flops_per_block_token=block_bytes)
    return list(comp.chains), tokens.service_times_s(trace), tokens


def _ccdf(ax, x: np.ndarray, label: str, **kw) -> None:
    xs = np.sort(x)
    ax.step(xs, 1.0 - np.arange(xs.size) / xs.size, where="post", label=label, **kw)


def measured_service_lines(path) -> list[str]:
    """The std ratio of the service times a live replay measured, per method (every completed request), and that of
    its requests' output lengths; [] where the replay's file is missing."""
    if not path.exists():
        return []
    rows = [r for r in read_csv(path) if not r["error"] and r.get("censored", "") not in ("True", 1.0)]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    parts = []
    for m in methods:
        service = np.array([float(r["service_s"]) for r in rows if r["method"] == m])
        parts.append(f"{m} {std_ratio(service):.2f} (n={service.size})")
    outputs = np.array([float(r["output_tokens"]) for r in rows if r["method"] == methods[0]])
    name = path.parent.name if path.parent.name != "results" else "table1 (results/)"
    return [f"measured service-time std ratio in the live replay {name}: " + ", ".join(parts)
            + f"; its requests' output tokens: std ratio {std_ratio(outputs):.2f}"]


def run(args) -> Summary:
    """Read the trace, compute the std ratios, plot the CCDFs next to exponentials of the same means."""
    trace = read_azure_trace(data_dir() / TRACE_FILE)
    gaps = np.diff(trace.arrival_s.astype(np.float64))
    chains, service, tokens = chains_on_testbed(trace)
    decode = np.asarray(tokens.per_output_token_s) * np.maximum(trace.output_tokens.mean() - 1.0, 0.0)
    decode_share = float(np.mean(decode / service.mean(axis=0))) if chains else math.nan
    rng = np.random.default_rng(args.seed)
    rows = [{"series": "inter-arrival", "n": gaps.size, "mean_s": gaps.mean(), "std_s": gaps.std(),
             "std_ratio": std_ratio(gaps), "paper_std_ratio": PAPER_INTERARRIVAL_RATIO}]
    for k, chain in enumerate(chains):
        x = service[:, k]
        rows.append({"series": f"service, chain {k} ({len(chain.servers)} hops)", "n": x.size, "mean_s": x.mean(),
                     "std_s": x.std(), "std_ratio": std_ratio(x), "paper_std_ratio": "0.71-0.81"})
    write_csv(args.out / "fig11.csv", rows)
    pyplot = plt()
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    _ccdf(a, gaps, f"trace (std ratio {std_ratio(gaps):.2f})", color="tab:blue")
    _ccdf(a, rng.exponential(gaps.mean(), gaps.size), "exponential, same mean", color="black", ls="--")
    a.set_xscale("symlog", linthresh=0.01)
    a.set_yscale("log")
    a.set_xlabel("inter-arrival time (s)")
    a.set_ylabel("P(X > x)")
    a.set_title(f"inter-arrivals, Azure 2023 code trace ({trace.arrival_s.size} requests)")
    a.legend()
    colors = pyplot.get_cmap("viridis")(np.linspace(0, 0.9, max(len(chains), 1)))
    for k, color in enumerate(colors):
        x = service[:, k]
        _ccdf(b, x, f"chain {k} (std ratio {std_ratio(x):.2f})", color=color)
    if chains:
        _ccdf(b, rng.exponential(service[:, 0].mean(), service.shape[0]), "exponential, chain 0's mean",
              color="black", ls="--")
    b.set_yscale("log")
    b.set_xlabel("service time (s)")
    b.set_title("service times on the LLaMA-2-7B testbed's chains (model)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "fig11.png")
    pyplot.close(fig)
    ratios = [r["std_ratio"] for r in rows[1:]]
    lines = [f"inter-arrival std ratio {rows[0]['std_ratio']:.2f} over {gaps.size} gaps (paper 13.15)",
             f"service-time std ratio {min(ratios):.2f}–{max(ratios):.2f} over the {len(chains)} chains of the default "
             f"composition (paper 0.71–0.81)" if ratios else "no chain formed",
             "input tokens: mean {:.0f}, std ratio {:.2f}; output tokens: mean {:.1f}, std ratio {:.2f}".format(
                 trace.input_tokens.mean(), std_ratio(trace.input_tokens), trace.output_tokens.mean(),
                 std_ratio(trace.output_tokens))]
    lines.append(f"decode steps are {100 * decode_share:.0f} % of the mean service time in our model")
    for replay in LIVE_REPLAYS:
        lines += measured_service_lines(args.out / replay)
    lines.append("Why they differ: the inter-arrival ratio is the trace's own (the whole code trace; it matches). A "
                 "service time inherits the variability of whichever of input and output length dominates it: in our"
                 " datasheet-and-RTT model every decode step costs a round trip per hop, so the output length (std "
                 "ratio 2.15 in the trace) dominates and the ratio exceeds 1; the paper's 0.71–0.81 implies service "
                 "dominated by prefill and fixed costs on its measured testbed (input length std ratio 0.96, diluted"
                 " by a constant part). Measured on our live swarms (the lines above), the service-time ratio "
                 "follows the replayed requests' output-length ratio: 0.35–0.43 where outputs vary 0.45 (20 "
                 "requests), 0.90–1.06 at 1.19 (40), 1.01–1.13 at 1.36 (100, batching servers), 0.72–1.95 at 2.23 "
                 "(200, with a burst above capacity, where each method's service stretches with the load it put on "
                 "its servers). The paper's 0.71–0.81 is what a sample of requests whose outputs vary less than the "
                 "whole trace's (between our 0.45 and 1.19) gives on a measured testbed, where prefill, relays and "
                 "fixed costs add a steadier part; the trace as a whole (2.15) gives more than 1.")
    command = f"python -m petals_chain.experiments fig11 --seed {args.seed}"
    return Summary("fig11", "the trace against the analysis' assumptions (Poisson, exponential)", command, lines,
                   ["inter-arrival std ratio 13.15 (burstier than Poisson)",
                    "service-time std ratio 0.71–0.81 (less variable than exponential)"], {"rows": rows})
