"""The orchestrator: server registry, composition, leases (JFFC or WS-RR), its HTTP app, and the client of that API.

Run it as ``python -m petals_chain.orchestrator``; servers and clients talk to it through
:mod:`petals_chain.orchestrator.client` (async) or :mod:`petals_chain.orchestrator.blocking`. With ``--state-dir`` its
state outlives the process (:mod:`petals_chain.orchestrator.store`, :mod:`petals_chain.orchestrator.persist`).
"""
