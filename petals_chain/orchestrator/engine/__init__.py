"""The engine: :class:`~petals_chain.orchestrator.engine.core.Orchestrator` keeps the server registry, the composition
and the leases consistent, and runs every step of a lease (policy, widths, persistence, metrics, trust) itself.

``core`` (the engine), ``composition`` and ``compose_runner`` (the method's composer, run off the event loop),
``chains`` (a composed chain as the leases see it), ``drain`` (moving sessions off a server), ``config`` (its
settings), ``metrics`` (its Prometheus collector). The HTTP layer (:mod:`petals_chain.orchestrator.http`) only
parses, calls the engine and replies.
"""
