"""Who may call which route of the orchestrator: the client, server and operator roles, and per-server secrets.

Three credentials, each a bearer token (``Authorization: Bearer T``): the *client* one leases chains, the *server* one
lets a server join, the *operator* one evicts and drains servers (and reads /metrics unless it is left open). A server
that registers gets its own secret in the reply; its heartbeats, its departure and its re-registration are accepted
only with that secret, so no other caller (not even one holding the server credential) can speak for it. With no
credential configured at all the API is open (the loopback default) and no secret is checked. A role left without a
credential while others have one is open to anyone. docs/trust.md, "Roles".
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from petals_chain.protocol.auth import ROLE_ENV, SECRET_HEADER, SHARED_ENV


class Role(str, Enum):
    """A caller's role, as its bearer token says."""

    CLIENT = "client"
    SERVER = "server"
    OPERATOR = "operator"


class ForbiddenError(PermissionError):
    """A known caller asked for something its role or identity does not allow (HTTP 403)."""


class UnauthorizedError(PermissionError):
    """No credential, or one the orchestrator does not know (HTTP 401)."""


@dataclass(frozen=True)
class Credentials:
    """The bearer token of each role (None: that role is open); ``metrics_open`` leaves /metrics to anyone."""

    client: str | None = None
    server: str | None = None
    operator: str | None = None
    metrics_open: bool = False

    @classmethod
    def shared(cls, token: str | None, **kw: object) -> Credentials:
        """One token for every role (the ``--token`` shorthand): a single-secret deployment, as before roles."""
        return cls(client=token, server=token, operator=token, **kw)  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        """Whether any credential is set (then per-server secrets are enforced too)."""
        return any(t is not None for t in (self.client, self.server, self.operator))

    @classmethod
    def resolve(cls, shared: str | None = None, *, client: str | None = None, server: str | None = None,
                operator: str | None = None, metrics_open: bool = False,
                env: Mapping[str, str] | None = None) -> Credentials:
        """Each role's token: its own option, else its own environment variable, else the shared token (option, then
        $PETALS_CHAIN_ORCH_TOKEN); empty strings count as unset."""
        env = os.environ if env is None else env
        shared = shared or env.get(SHARED_ENV) or None
        given = {"client": client, "server": server, "operator": operator}
        tokens = {role: given[role] or env.get(ROLE_ENV[role]) or shared for role in given}
        return cls(**tokens, metrics_open=metrics_open)

    def roles_of(self, token: str) -> set[Role]:
        """The roles a bearer token grants (a shared token grants several)."""
        return {r for r in Role if _same(getattr(self, r.value), token)}


def _same(expected: str | None, given: str) -> bool:
    """Constant-time equality of a configured token and a given one (False when none is configured)."""
    return expected is not None and hmac.compare_digest(expected.encode(), given.encode())


def _digest(secret: str) -> bytes:
    """What the orchestrator keeps of a server secret: its SHA-256 (a memory dump does not reveal it)."""
    return hashlib.sha256(secret.encode()).digest()


class ServerSecrets:
    """One secret per registered server name, issued at registration; only digests are kept."""

    def __init__(self, new_secret: Callable[[], str] = lambda: secrets.token_urlsafe(32)) -> None:
        self._digests: dict[str, bytes] = {}
        self._new = new_secret

    def issue(self, name: str) -> str:
        """A fresh secret for ``name`` (replacing any older one)."""
        secret = self._new()
        self._digests[name] = _digest(secret)
        return secret

    def has(self, name: str) -> bool:
        """Whether ``name`` holds a secret now."""
        return name in self._digests

    def matches(self, name: str, secret: str | None) -> bool:
        """Whether ``secret`` is the one issued to ``name``."""
        want = self._digests.get(name)
        return want is not None and secret is not None and hmac.compare_digest(want, _digest(secret))

    def owner(self, secret: str) -> str | None:
        """The server whose secret this is (None: nobody's)."""
        d = _digest(secret)
        for name, want in self._digests.items():
            if hmac.compare_digest(want, d):
                return name
        return None

    def revoke(self, name: str) -> None:
        """Forget ``name``'s secret (an evicted server can no longer speak for itself)."""
        self._digests.pop(name, None)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the roles its bearer token grants, or the server whose secret it carries."""

    roles: frozenset[Role]
    server: str | None = None  # the server this caller proved to be, by its secret

    def has(self, role: Role) -> bool:
        """Whether the caller holds ``role``."""
        return role in self.roles


# Probes of orchestration tools, which carry no credentials, and the live page's HTML (dashboard.PAGE_PATH: it holds
# no data; what it draws, /dashboard.json, needs a credential).
OPEN_ROUTES = frozenset({"/health", "/ready", "/dashboard"})
# Route (aiohttp's canonical form) → the roles allowed; SELF: the named server itself, by its secret.
SELF = "self"
POLICY: dict[tuple[str, str], tuple[str, ...]] = {
    ("GET", "/metrics"): (Role.OPERATOR,),
    ("GET", "/chains"): (Role.CLIENT, Role.SERVER, Role.OPERATOR),
    ("GET", "/queue"): (Role.CLIENT, Role.OPERATOR),
    ("GET", "/servers"): (Role.CLIENT, Role.SERVER, Role.OPERATOR),
    ("GET", "/dashboard.json"): (Role.CLIENT, Role.OPERATOR),  # what clients may read anyway: servers, chains, queue
    ("GET", "/swarm"): (Role.CLIENT, Role.SERVER, Role.OPERATOR),  # initial peers and model: what joining needs
    ("POST", "/servers/register"): (Role.SERVER,),  # re-registering a live name also needs that server's secret
    ("POST", "/servers/heartbeat"): (SELF,),
    ("GET", "/servers/{name}/assignment"): (SELF, Role.OPERATOR),
    ("POST", "/servers/{name}/leave"): (SELF,),
    ("POST", "/servers/{name}/evict"): (Role.OPERATOR,),
    ("POST", "/servers/{name}/cordon"): (Role.OPERATOR,),
    ("POST", "/servers/{name}/drain"): (SELF, Role.OPERATOR),  # a server drains itself on SIGTERM
    ("GET", "/servers/{name}/drain"): (SELF, Role.OPERATOR),
    ("GET", "/migrations"): (Role.CLIENT, Role.OPERATOR),
    ("POST", "/migrations"): (Role.OPERATOR,),
    ("GET", "/width"): (Role.CLIENT, Role.OPERATOR),
    ("POST", "/width"): (Role.OPERATOR,),
    ("POST", "/lease/{lease_id}/migrated"): (Role.CLIENT,),
    ("POST", "/lease/{lease_id}/migration-failed"): (Role.CLIENT,),
    ("POST", "/lease"): (Role.CLIENT,),
    ("POST", "/lease/{lease_id}/renew"): (Role.CLIENT,),
    ("POST", "/lease/{lease_id}/release"): (Role.CLIENT,),
    ("POST", "/lease/{lease_id}/report-failure"): (Role.CLIENT,),
}


class Guard:
    """Decides who may call what (:data:`POLICY`), and holds the per-server secrets."""

    def __init__(self, credentials: Credentials | None = None) -> None:
        self.credentials = credentials or Credentials()
        self.secrets = ServerSecrets()
        self.banned: dict[str, str] = {}  # server name → why the operator evicted it (it may not register)

    @property
    def enabled(self) -> bool:
        """Whether anything is checked at all."""
        return self.credentials.enabled

    def caller(self, request: web.Request) -> Caller:
        """The caller's roles from its bearer token (a role without a credential is everyone's)."""
        open_roles = {r for r in Role if getattr(self.credentials, r.value) is None}
        header = request.headers.get("Authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else None
        if token is None:
            return Caller(frozenset(open_roles))
        roles = self.credentials.roles_of(token)
        server = self.secrets.owner(token)
        if not roles and server is None and self.enabled:
            raise UnauthorizedError("unknown bearer token")
        return Caller(frozenset(roles | open_roles), server)

    def authorize(self, request: web.Request, route: str, server_name: str | None) -> Caller:
        """The caller, if it may call ``route``; UnauthorizedError / ForbiddenError otherwise.

        ``server_name``: the server the request speaks for (the path's ``{name}``, or a heartbeat body's ``name``).
        """
        if not self.enabled or route in OPEN_ROUTES:
            return Caller(frozenset(Role))
        if route == "/metrics" and self.credentials.metrics_open:
            return Caller(frozenset())
        caller = self.caller(request)
        allowed = POLICY.get((request.method, route))
        if allowed is None:  # a route without a policy: the operator's
            allowed = (Role.OPERATOR,)
        if SELF in allowed and server_name is not None and caller.server == server_name:
            return caller
        if any(isinstance(r, Role) and caller.has(r) for r in allowed):
            return caller
        if not caller.roles and caller.server is None:
            raise UnauthorizedError("missing bearer token")
        roles = "/".join(sorted(r.value for r in caller.roles))
        who = f"server {caller.server!r}" if caller.server else (f"role {roles}" if roles else "")
        need = " or ".join("the server itself (its secret)" if r == SELF else f"the {r.value} credential"
                           for r in allowed)
        raise ForbiddenError(f"{request.method} {route} needs {need}; the caller is {who or 'anonymous'}")

    def check_reregistration(self, request: web.Request, name: str, alive: bool) -> None:
        """A live server's name is taken back only with its secret (header :data:`SECRET_HEADER`); an evicted name
        not at all."""
        if name in self.banned:
            raise ForbiddenError(f"server {name!r} was evicted by the operator ({self.banned[name]}); it may register "
                                 "again once the operator lifts the eviction")
        if not self.enabled or not alive or not self.secrets.has(name):
            return
        if not self.secrets.matches(name, request.headers.get(SECRET_HEADER)):
            raise ForbiddenError(f"server {name!r} is registered and alive; only it may register again (with its "
                                 f"secret in {SECRET_HEADER}), or the name is free once it leaves or expires")
