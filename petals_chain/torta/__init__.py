"""TORTA: temporal-aware geo-distributed GPU scheduling (optimal transport + PPO macro layer, greedy micro layer).

The model, both layers and every open point's default are in docs/torta.md; the defaults live in
:mod:`petals_chain.torta.params`.
"""
