"""The orchestrator over HTTP: ``api`` (routes; each handler parses its body, calls the engine and replies),
``request_body`` (bodies read and validated), ``dashboard`` (the live page, ``static/``) and ``exposure`` (what the
API may listen on without TLS or credentials).
"""
