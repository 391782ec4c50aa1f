"""The PETALS client through orchestrator leases: the leased inference session and the chain-following sequence manager.

``from petals_chain import AutoDistributedModelForCausalLM`` is the entry point users meet.
"""
