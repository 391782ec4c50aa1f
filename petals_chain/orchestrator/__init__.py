"""The orchestrator: server registry, composition, leases (JFFC or WS-RR), and its HTTP app.

Run it as ``python -m petals_chain.orchestrator``; servers and clients talk to it through
:mod:`petals_chain.protocol.http_client` (async) or :mod:`petals_chain.protocol.blocking`. With ``--state-dir`` its
state outlives the process (:mod:`petals_chain.orchestrator.state.store`,
:mod:`petals_chain.orchestrator.state.persist`).
"""
