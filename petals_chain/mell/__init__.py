"""Mell: KV-cache bin packing with bounded migration (docs/mell.md).

`classes` (size classes, GPU sizes), `scheduler` (the online Allocate/Depart/Update scheduler),
`baselines` (best/worst/first fit, Llumnix-style load balancing), `hybrid` (KV transfer vs token
replay within budgets), `optimal` (bin-packing ILP and size bound), `invariants` (Theorem 1 checks),
`workloads` and `sim` (the time-stepped simulator).
"""
