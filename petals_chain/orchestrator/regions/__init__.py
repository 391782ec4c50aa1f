"""The region-aware orchestrator: ``front`` (one engine per region behind TORTA's macro layer), ``api`` (its HTTP
routes), ``cli`` (``python -m petals_chain.orchestrator.regions``).
"""
