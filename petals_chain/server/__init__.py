"""The orchestrated PETALS server: a ``petals`` ``Server`` subclass that serves the span the orchestrator assigns.

Run it as ``python -m petals_chain.server MODEL_DIR --orchestrator URL --memory-budget 20GB``.
"""
