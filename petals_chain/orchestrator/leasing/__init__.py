"""Leases: who holds which chain's slot, who waits, and which chain a waiting request gets.

``leases`` (the manager: queue, slots, TTLs, bookkeeping), ``policy`` (the one decision a lease policy makes and the
capabilities a manager declares), ``policies`` (the one registry of live policies the CLI, the config file and the
API choose from), ``migration`` (leases that move), ``ws_rr`` (WS-RR, routed over the placement), ``widths`` (the
speculative width of each lease), ``recent`` (the newest finished leases, for the live page).
"""
