"""The paper's experiments: `python -m petals_chain.experiments NAME [--quick] [--seed S] [--out DIR]`.

Each experiment lives in its own module exposing ``run(args) -> Summary``; it
writes ``DIR/NAME.csv`` and ``DIR/NAME.png`` and returns the headline numbers
that go into ``DIR/README.md`` next to the paper's.
"""

from __future__ import annotations

import importlib

# name -> module (relative to this package); a module is imported only when its experiment runs
EXPERIMENTS: dict[str, str] = {
    "fig3": "fig3_placement",
    "fig4": "fig4_cache",
    "fig5": "fig5_dispatch",
    "fig6": "fig6_c_curve",
    "fig7": "fig7_c_star",
    "fig8": "fig8_overall",
    "fig9": "fig9_computation",  # from the committed profile of the emulated testbed (results/profile/)
    "fig10": "fig10_communication",
    "fig11": "fig11_trace",  # the Azure trace against Poisson / exponential (needs the data folder)
    "table1": "table1",  # live: needs root and a profile (experiments/table1.sh)
    "moldable-table1": "moldable_table1",  # moldable jobs (docs/moldable.md); writes results/moldable_table1.*
    "moldable-fig2": "moldable_fig2",
    "moldable-classes": "moldable_classes",
    "moldable-live": "moldable_live",  # live: SmolLM2 on a loopback swarm, speculative width (docs/moldable.md)
    "mell-fig3": "mell_fig3",  # from the committed GPU measurement (results/gpu-batched/), nothing simulated
    "mell-fig6": "mell_fig6",
    "mell-fig11": "mell_fig11",
    "mell-fig12": "mell_fig12",
    "mell-fig13": "mell_fig13",
    "mell-fig14": "mell_fig14",
    "mell-fig15": "mell_fig15",
    "mell-theorem2": "mell_theorem2",  # Theorem 2's |A| ≤ 4/3·OPT + c against the exact optimum (ILP)
    "mell-downtime": "mell_downtime",  # live: SmolLM2 swarm, KV transfer vs token replay (root for the tbf cap)
    "mell-consolidate": "mell_consolidate",  # live: Mell packs sessions on a loopback swarm vs worst fit
    "migration-jffc": "migration_jffc",  # live: JFFC with session migration on a loopback swarm (docs/migration.md)
    "torta-fig5a": "torta_fig5a",
    "torta-fig8": "torta_fig8",
    "torta-fig9": "torta_fig9",
    "torta-fig10": "torta_fig10",
    "torta-fig11": "torta_fig11",
    "torta-fig12": "torta_fig12",
    "torta-trust": "torta_trust",  # the PPO layer's trust region 0.15 / 0.5 / 1.0 against OT alone
    "torta-live": "torta_live",  # live: needs root (network namespaces per origin)
}


def load(name: str):
    """Import the module of experiment `name` (KeyError with the known names if unknown)."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"{__name__}.{EXPERIMENTS[name]}")
