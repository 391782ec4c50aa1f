"""How a caller proves who it is to the orchestrator: the conventions both sides follow.

A bearer token per role (client, server, operator; or one shared token) sent as ``Authorization: Bearer T``, taken
from an option or the role's environment variable; a registered server's own secret sent back in
:data:`SECRET_HEADER` when it registers again. The orchestrator's side (credentials, secrets, the guard) is in
:mod:`petals_chain.orchestrator.trust.auth`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SECRET_HEADER = "X-Petals-Chain-Server-Secret"  # a re-registering server proves it is the same one
SHARED_ENV = "PETALS_CHAIN_ORCH_TOKEN"  # one token for every role (the shorthand)
ROLE_ENV = {"client": "PETALS_CHAIN_CLIENT_TOKEN", "server": "PETALS_CHAIN_SERVER_TOKEN",
            "operator": "PETALS_CHAIN_OPERATOR_TOKEN"}


def role_token(role: str, given: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The token a client or server process sends: ``given``, else its role's variable, else the shared one."""
    env = os.environ if env is None else env
    return given or env.get(ROLE_ENV[role]) or env.get(SHARED_ENV) or None
