"""How the orchestrator's HTTP API is exposed: its TLS context, and warnings when a bind address exposes too much.

The default bind is loopback. On any other address a credential sent over plain HTTP can be read off the wire, and
with no credential at all anyone who reaches the port can lease, register and deregister: both are said once at
startup (docs/trust.md, "TLS").
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from pathlib import Path

from petals_chain.model import SpecError
from petals_chain.orchestrator.trust.auth import Credentials


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts this machine's own connections ('localhost', 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def server_tls(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The server-side TLS context from a PEM certificate and key (both or neither); SpecError naming the option."""
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        raise SpecError("--tls-cert and --tls-key go together: give both (or neither, for plain HTTP)")
    for flag, path in (("--tls-cert", cert_file), ("--tls-key", key_file)):
        if not os.path.isfile(path):
            raise SpecError(f"{flag} {path!r}: no such file")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise SpecError(f"--tls-cert/--tls-key: cannot load {cert_file!r} with {key_file!r}: {exc}") from None
    return ctx


def exposure_warnings(host: str, credentials: Credentials, *, tls: bool) -> list[str]:
    """What an operator should know about listening on ``host`` this way (empty on loopback)."""
    if is_loopback(host):
        return []
    if not credentials.enabled:
        return [f"listening on {host} without credentials: anyone who reaches it can lease, register and deregister "
                "(--token, or --client-token/--server-token/--operator-token)"]
    if not tls:
        return [f"listening on {host} over plain HTTP: bearer tokens and server secrets travel in clear text "
                "(give --tls-cert and --tls-key)"]
    return []


def self_signed_pair(folder: Path, host: str = "127.0.0.1") -> tuple[str, str]:
    """A certificate for ``host`` signed by its own (EC P-256) key, as PEM files (cert, key): for trying HTTPS on
    loopback (tests, the benchmark); a real deployment uses a certificate its clients already trust."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "petals-chain bench")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)
