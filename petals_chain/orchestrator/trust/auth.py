"""Who may call which route of the orchestrator: the client, server and operator roles, and per-server secrets.

Three credentials, each a bearer token (``Authorization: Bearer T``): the *client* one leases chains, the *server* one
lets a server join, the *operator* one evicts and drains servers (and reads /metrics unless it is left open). A server
that registers gets its own secret in the reply; its heartbeats, its departure and its re-registration are accepted
only with that secret, so no other caller (not even one holding the server credential) can speak for it. With no
credential configured at all the API is open (the loopback default) and no secret is checked. A role left without a
credential while others have one is open to anyone. docs/trust.md, "Roles".

Secrets outlive a restart: with ``--state-dir`` each one is kept there as a salted hash (PBKDF2-SHA256, a random salt
per secret, :func:`hash_secret`), so a restored server name answers only to the secret issued to it before the
restart, and evictions are kept the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

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
    """The in-memory fingerprint of a server secret known this run: its SHA-256 (a memory dump does not reveal it)."""
    return hashlib.sha256(secret.encode()).digest()


KDF = "pbkdf2_sha256"
KDF_ITERATIONS = 20_000  # secrets are 256 random bits: the salt and stretch are defence in depth, not what makes
# them unguessable, so the work stays small (~10 ms) for the few checks that need it (see ServerSecrets.matches)
SALT_BYTES = 16
REFUSED_REMEMBERED = 64  # wrong secrets remembered per not-yet-proven name (each costs one hash computation once)


def hash_secret(secret: str, *, salt: bytes | None = None, iterations: int = KDF_ITERATIONS) -> str:
    """The stored form of a server secret: ``pbkdf2_sha256$ITERATIONS$SALT$HASH`` (hex), with a fresh random salt."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    derived = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
    return f"{KDF}${iterations}${salt.hex()}${derived.hex()}"


def verify_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` is the one :func:`hash_secret` stored as ``stored`` (constant-time comparison); a stored
    form this version does not read matches nothing."""
    try:
        kdf, iterations, salt, want = stored.split("$")
        if kdf != KDF:
            return False
        derived = hashlib.pbkdf2_hmac("sha256", secret.encode(), bytes.fromhex(salt), int(iterations))
        return hmac.compare_digest(derived, bytes.fromhex(want))
    except ValueError:
        return False


class SecretJournal(Protocol):
    """Where issued secrets (as salted hashes) and evictions are kept across a restart (--state-dir)."""

    def secret_stored(self, name: str, hashed: str) -> None:
        """``name`` holds a new secret, stored as ``hashed``."""

    def secret_revoked(self, name: str) -> None:
        """``name`` holds no secret any more."""

    def ban_changed(self, name: str, reason: str | None) -> None:
        """``name`` was evicted (``reason``) or its eviction lifted (None)."""


class ServerSecrets:
    """One secret per registered server name, issued at registration; only hashes are kept.

    Each secret's salted hash (:func:`hash_secret`) is what a restart restores; the secrets issued or proved during
    this run are also known by their SHA-256, which answers every later check at once. A name restored from the
    state directory is proved by the first request that carries its secret (one salted hash computed); a wrong
    secret for it costs that computation once, then it is remembered as wrong.
    """

    def __init__(self, new_secret: Callable[[], str] = lambda: secrets.token_urlsafe(32),
                 journal: SecretJournal | None = None) -> None:
        self._digests: dict[str, bytes] = {}  # name → SHA-256 of its secret (issued or proved this run)
        self._stored: dict[str, str] = {}  # name → salted hash of its secret (every name that holds one)
        self._refused: dict[str, set[bytes]] = {}  # not-yet-proven name → SHA-256s of secrets found wrong
        self._new = new_secret
        self.journal = journal

    def restore(self, stored: Mapping[str, str]) -> None:
        """Take the salted hashes kept before a restart (name → :func:`hash_secret` form)."""
        for name, hashed in stored.items():
            self._stored[name] = hashed
            self._digests.pop(name, None)

    def issue(self, name: str) -> str:
        """A fresh secret for ``name`` (replacing any older one)."""
        secret = self._new()
        self._digests[name] = _digest(secret)
        self._stored[name] = hashed = hash_secret(secret)
        self._refused.pop(name, None)
        if self.journal is not None:
            self.journal.secret_stored(name, hashed)
        return secret

    def has(self, name: str) -> bool:
        """Whether ``name`` holds a secret now."""
        return name in self._stored

    def matches(self, name: str, secret: str | None) -> bool:
        """Whether ``secret`` is the one issued to ``name``."""
        if secret is None or name not in self._stored:
            return False
        d = _digest(secret)
        want = self._digests.get(name)
        if want is not None:
            return hmac.compare_digest(want, d)
        refused = self._refused.setdefault(name, set())
        if d in refused:
            return False
        if verify_secret(secret, self._stored[name]):  # a restored name, proved now
            self._digests[name] = d
            self._refused.pop(name, None)
            return True
        if len(refused) >= REFUSED_REMEMBERED:
            refused.pop()
        refused.add(d)
        return False

    def owner(self, secret: str) -> str | None:
        """The server whose secret this is, among those issued or proved this run (None: nobody's known)."""
        d = _digest(secret)
        for name, want in self._digests.items():
            if hmac.compare_digest(want, d):
                return name
        return None

    def revoke(self, name: str) -> None:
        """Forget ``name``'s secret (an evicted server can no longer speak for itself)."""
        self._digests.pop(name, None)
        self._refused.pop(name, None)
        if self._stored.pop(name, None) is not None and self.journal is not None:
            self.journal.secret_revoked(name)


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
    ("GET", "/policies"): (Role.CLIENT, Role.OPERATOR),
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
        self.journal: SecretJournal | None = None

    def keep(self, journal: SecretJournal, secrets: Mapping[str, str], banned: Mapping[str, str]) -> None:
        """Restore what ``journal`` kept before a restart (salted secret hashes, evictions) and write every change
        to it from now on."""
        self.secrets.restore(secrets)
        self.banned.update(banned)
        self.secrets.journal = self.journal = journal

    def ban(self, name: str, reason: str) -> None:
        """The operator evicted ``name``: its secret is revoked and it may not register until :meth:`unban`."""
        self.secrets.revoke(name)
        self.banned[name] = reason
        if self.journal is not None:
            self.journal.ban_changed(name, reason)

    def unban(self, name: str) -> None:
        """The operator lifted ``name``'s eviction."""
        if self.banned.pop(name, None) is not None and self.journal is not None:
            self.journal.ban_changed(name, None)

    @property
    def enabled(self) -> bool:
        """Whether anything is checked at all."""
        return self.credentials.enabled

    def caller(self, request: web.Request, server_name: str | None = None) -> Caller:
        """The caller's roles from its bearer token (a role without a credential is everyone's), and the server it
        proved to be: any known this run, or ``server_name`` (the server the request speaks for) by its secret."""
        open_roles = {r for r in Role if getattr(self.credentials, r.value) is None}
        header = request.headers.get("Authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else None
        if token is None:
            return Caller(frozenset(open_roles))
        roles = self.credentials.roles_of(token)
        server = self.secrets.owner(token)
        if server is None and not roles and server_name is not None and self.secrets.matches(server_name, token):
            server = server_name
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
        caller = self.caller(request, server_name)
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
