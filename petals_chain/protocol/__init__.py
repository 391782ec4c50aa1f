"""The orchestrator's wire contract, in one place: what client, server and orchestrator say to each other.

The request and reply bodies (pydantic models: a field is declared once, for the side that writes it and the side
that reads it), the one hop type of a chain, the limits both sides check, the conventions both sides follow (the
server-secret header, role tokens, the DHT prefix, fixed messages), the keys of the KV-cache transfer between
servers, and the one HTTP client of the orchestrator's API (async, its blocking face, one-off calls). ``client/``,
``server/`` and ``orchestrator/`` import this package and never each other.
"""
