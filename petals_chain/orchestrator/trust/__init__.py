"""Whom the orchestrator believes: ``auth`` (roles, tokens, servers' secrets), ``belief`` (servers held out while
verified, cordons, confirmed failure reports), ``suspects`` (false failure reports, rate-limited per request) and
``verify`` (checking a server's outputs against a reference).
"""
