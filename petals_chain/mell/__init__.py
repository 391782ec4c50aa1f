"""Mell: KV-cache bin packing with bounded migration (docs/mell.md).

`classes` (size classes, GPU sizes), `scheduler` (the online Allocate/Depart/Update scheduler),
`baselines` (best/worst/first fit, Llumnix-style load balancing), `hybrid` (KV transfer vs token
replay within budgets), `optimal` (bin-packing optimum: bounds, ILP, exact search), `invariants` (Theorem 1
checks), `random_sequences` (random request sequences for the checks), `workloads` and `sim` (the time-stepped
simulator).
"""
