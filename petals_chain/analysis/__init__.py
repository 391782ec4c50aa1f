"""Queueing analysis of JFFC over composed chains: Theorem 3.7 bounds (bounds.py) and exact references (ctmc.py)."""
