"""Turn a Composition into the JSON document and the readable table the CLI prints.

Spans are written the PETALS way, 0-indexed and end-exclusive: ``{"start": 0, "end": 15}`` in JSON and
``0:15`` in the table (docs/model.md, "Conventions"); the paper's 1-indexed a_j stays inside the algorithms.
The JSON is strict: a bound that does not exist (an unstable system, where Theorem 3.7 gives infinity) is ``null``,
and ``stable`` / ``rate_target_met`` say why, so any JSON reader can load it.
"""

from __future__ import annotations

import math
from typing import Any

from petals_chain import defaults
from petals_chain.model import Composition, span_json, span_text


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in dicts, lists, tuples) replaced by None: valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def load_summary(total_rate_per_s: float, arrival_rate: float, target_load: float) -> dict[str, Any]:
    """Whether the chains can serve λ at all (``stable``: λ < ν, else the queue grows without bound and the response
    time has no bound) and at the target utilisation (``rate_target_met``: ν >= λ/ρ̄)."""
    target_rate = arrival_rate / target_load
    return {
        "arrival_rate_per_s": arrival_rate,
        "target_load": target_load,
        "rate_target_per_s": target_rate,
        "utilisation": arrival_rate / total_rate_per_s if total_rate_per_s > 0 else None,
        "stable": arrival_rate < total_rate_per_s,
        "rate_target_met": total_rate_per_s >= target_rate,
    }


def composition_to_dict(comp: Composition, arrival_rate: float | None = None,
                        target_load: float | None = None) -> dict[str, Any]:
    """The CLI's JSON shape: c, placement (name → {start, end}), chains with their spans, rate, bounds; with the
    arrival rate, also ``stable``, ``rate_target_met`` and a ``load`` summary. Strict JSON (no NaN, no Infinity)."""
    names = [s.name for s in comp.servers]
    placement = {
        names[j]: span_json(*comp.placement.span(j))
        for j in range(len(names))
        if comp.placement.num_blocks[j] > 0
    }
    chains = [
        {
            "servers": [names[j] for j in ch.servers],
            "blocks": list(ch.blocks),
            "spans": [{"server": names[j], **span_json(a, b)} for j, a, b in ch.petals_spans()],
            "capacity": ch.capacity,
            "service_time_s": ch.service_time_s,
        }
        for ch in comp.sorted_chains()
    ]
    out: dict[str, Any] = {
        "model": comp.model.name,
        "c": comp.c,
        "placement": placement,
        "idle_servers": [n for j, n in enumerate(names) if comp.placement.num_blocks[j] == 0],
        "chains": chains,
        "total_capacity": comp.total_capacity,
        "total_rate_per_s": comp.total_rate_per_s,
        "bounds": {"lower_s": comp.meta.get("lower_s"), "upper_s": comp.meta.get("upper_s")},
    }
    if arrival_rate is not None:
        load = load_summary(comp.total_rate_per_s, arrival_rate, target_load or defaults.TARGET_LOAD)
        out["stable"], out["rate_target_met"], out["load"] = load["stable"], load["rate_target_met"], load
        if not load["stable"]:
            out["bounds"]["why_null"] = "unstable: the arrival rate is at least the total service rate"
    tuning = comp.meta.get("tuning")
    if tuning is not None:
        out["tuning"] = {
            "criterion": tuning.criterion,
            "c_by_criterion": {k: tuning.best(k) for k in ("lower", "upper", "surrogate")},
            "curve": [
                {"c": p.c, "surrogate": p.surrogate, "gca_chains": p.gca_chains, "lower_s": p.lower_s,
                 "upper_s": p.upper_s, "total_rate_per_s": p.total_rate_per_s,
                 **({"stable": arrival_rate < p.total_rate_per_s} if arrival_rate is not None else {})}
                for p in tuning.curve
            ],
        }
    joint = comp.meta.get("joint")
    if joint is not None:
        out["joint"] = {"c": joint.c, "gbp_cr": joint.variant, "kept_chains": joint.kept_chains,
                        "whole_model_chains": joint.whole_model_chains, "estimate_s": joint.estimate_s,
                        "estimated_by": joint.estimated_by, "estimated_candidates": joint.estimated_candidates}
    return strict_json(out)


def composition_table(comp: Composition, arrival_rate: float | None = None, target_load: float | None = None) -> str:
    """A human-readable summary: placement, chains with capacities, c and the bounds (or why there are none)."""
    d = composition_to_dict(comp, arrival_rate, target_load)
    lines = [f"model {d['model']}: L={comp.model.num_blocks} blocks, c={d['c']}"]
    lines.append("")
    lines.append(f"{'server':<16}{'blocks':>12}{'memory GB':>11}{'tau_c s':>9}{'tau_p s':>9}")
    for j, s in enumerate(comp.servers):
        span = span_text(*comp.placement.span(j)) if comp.placement.num_blocks[j] else "-"
        lines.append(f"{s.name:<16}{span:>12}{s.memory_bytes / 1e9:>11.2f}{s.tau_c_s:>9.3f}{s.tau_p_s:>9.4f}")
    lines.append("")
    lines.append(f"{'chain':<6}{'capacity':>9}{'T_k s':>9}  servers [blocks start:end]")
    for k, ch in enumerate(d["chains"]):
        hops = " -> ".join(f"{h['server']}[{span_text(h['start'], h['end'])}]" for h in ch["spans"])
        lines.append(f"{k:<6}{ch['capacity']:>9}{ch['service_time_s']:>9.3f}  {hops}")
    lines.append("")
    lines.append(f"total capacity {d['total_capacity']} jobs, total service rate {d['total_rate_per_s']:.4f} /s")
    if arrival_rate is not None:
        load = d["load"]
        over = "" if load["rate_target_met"] else f" (above the target load {load['target_load']:g})"
        lines.append(f"arrival rate {arrival_rate:.4g} /s, load {arrival_rate / d['total_rate_per_s']:.3f}{over}")
        if not d["stable"]:
            lines.append("unstable: the arrival rate is at least the total service rate, so requests queue without "
                         "bound and the mean response time has no bound")
    b = d["bounds"]
    if b["lower_s"] is not None:
        lines.append(f"mean response time (Theorem 3.7): {b['lower_s']:.3f} s <= T <= {b['upper_s']:.3f} s")
    if "tuning" in d:
        t = d["tuning"]
        picks = ", ".join(f"{k}: c={v}" for k, v in t["c_by_criterion"].items())
        lines.append(f"c chosen by the {t['criterion']} criterion; each criterion picks {picks}")
    if "joint" in d:
        j = d["joint"]
        lines.append(f"c and chains chosen together: c={j['c']}, the first {j['kept_chains']} chains of "
                     f"GBP-CR ({j['gbp_cr']}) + GCA, {j['whole_model_chains']} whole-model chain(s) on idle servers")
        if j["estimated_by"]:
            lines.append(f"estimated mean response time {j['estimate_s']:.3f} s ({j['estimated_by']}; "
                         f"{j['estimated_candidates']} candidate(s) the bounds left were estimated)")
    return "\n".join(lines)
