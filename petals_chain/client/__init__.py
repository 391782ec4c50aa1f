"""The PETALS client through orchestrator leases: every inference session runs along a chain JFFC chose.

``from petals_chain import AutoDistributedModelForCausalLM`` (client/model.py) is the entry point users meet; the
leased session with its failover is client/session.py, its routing client/sequence_manager.py, holding a lease
client/lease.py, and what a session records client/records.py.
"""
