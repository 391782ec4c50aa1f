"""Testbed launcher: testbed files, MIG slices or CPU stand-ins, per-server namespaces with delays, teardown.

Entry point: ``python -m petals_chain.launch TESTBED.yaml`` (see docs/testbed.md); library: :class:`Launch`.
"""
