"""Per-tenant bearer tokens for the Collector's OTLP receivers (deploy/otel/auth.yaml, docs/otlp-mapping.md,
"Authenticated tenants").

Each tenant gets its own token: a JWT whose subject (``sub``) is the tenant id, signed with the operator's
Ed25519 key. The Collector's ``oidc`` authenticator verifies it against the public half alone, a local JWKS
file (``public_keys_file``: no identity provider is reached, the file is reloaded when it changes), and
exposes the subject as ``auth.subject``, which the recipe writes over the spans' ``tenant.id``. A client
with no token, a token of another key, an expired one or one for another issuer or audience is refused
(HTTP 401, gRPC ``Unauthenticated``).

The key lives in one directory::

    <dir>/tenant-tokens.key    the private key (PEM, mode 0600): whoever holds it can mint any tenant's token
    <dir>/tenant-tokens.jwks   the public key (JWK Set) the Collector reads

Signing uses the ``openssl`` command (OpenSSL 3: ``genpkey -algorithm ED25519``, ``pkeyutl -sign -rawin``),
so no cryptography package is needed. Revoking one tenant's token means a new key and new tokens for all
(or short lifetimes): the extension has no deny list.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The ``iss`` of every token and the provider's ``issuer_url`` in deploy/otel/auth.yaml.
ISSUER: Final = "ttft-pipeline"
#: The ``aud`` of every token and the provider's ``audience`` in deploy/otel/auth.yaml.
AUDIENCE: Final = "otelcol-ttft"
KEY_FILE: Final = "tenant-tokens.key"
JWKS_FILE: Final = "tenant-tokens.jwks"
#: A tenant id of the contract (docs/design.md: 1 to 64 characters), without spaces or control characters.
_TENANT: Final = re.compile(r"^[^\s\x00-\x1f]{1,64}$")
#: The DER SubjectPublicKeyInfo of an Ed25519 key is this 12-byte prefix and the 32 raw key bytes.
_ED25519_SPKI_PREFIX: Final = bytes.fromhex("302a300506032b6570032100")


class TokenError(RuntimeError):
    """A key could not be made or read, or a token not signed; the message says why."""


@dataclass(frozen=True)
class TokenKeys:
    """The paths of one key pair (module docstring)."""

    key: Path
    jwks: Path

    @classmethod
    def in_dir(cls, directory: Path) -> TokenKeys:
        return cls(directory / KEY_FILE, directory / JWKS_FILE)


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False, timeout=30)
    except FileNotFoundError:
        raise TokenError("the openssl command is not installed (Debian: apt-get install openssl)") from None
    if done.returncode != 0:
        raise TokenError(f"openssl {args[0]} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    return done.stdout


def key_id(raw_public: bytes) -> str:
    """A short stable id of a public key (its ``kid``)."""
    return _b64url(raw_public[:9])


def make_keys(directory: Path, *, overwrite: bool = False) -> TokenKeys:
    """Create a new key pair in ``directory`` (the private key 0600); refuses to replace one unless
    ``overwrite`` (a new key invalidates every token signed with the old one)."""
    keys = TokenKeys.in_dir(directory)
    if keys.key.exists() and not overwrite:
        raise TokenError(f"{keys.key} exists: a new key invalidates every token signed with it (--overwrite)")
    directory.mkdir(parents=True, exist_ok=True)
    pem = _openssl("genpkey", "-algorithm", "ED25519")
    fd = os.open(keys.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    os.chmod(keys.key, 0o600)
    write_jwks(keys)
    return keys


def public_key(key: Path) -> bytes:
    """The 32 raw bytes of the Ed25519 public key of the private key file ``key``."""
    der = _openssl("pkey", "-in", str(key), "-pubout", "-outform", "DER")
    if len(der) != 44 or not der.startswith(_ED25519_SPKI_PREFIX):
        raise TokenError(f"{key} is not an Ed25519 private key")
    return der[len(_ED25519_SPKI_PREFIX) :]


def write_jwks(keys: TokenKeys) -> Path:
    """(Re)write the JWK Set of ``keys.key``'s public half, the Collector's ``public_keys_file``."""
    raw = public_key(keys.key)
    doc = {
        "keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": key_id(raw), "x": _b64url(raw)}]
    }
    tmp = keys.jwks.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(keys.jwks)
    return keys.jwks


def mint(key: Path, tenant: str, *, days: float = 365.0, now_s: float | None = None) -> str:
    """A bearer token for ``tenant`` (``Authorization: Bearer <token>``), valid for ``days``."""
    if not _TENANT.match(tenant) or tenant == "__other__":
        raise TokenError(f"not a tenant id of the contract (1-64 characters, no spaces): {tenant!r}")
    if days <= 0:
        raise TokenError("days must be positive")
    now = int(time.time() if now_s is None else now_s)
    header = {"alg": "EdDSA", "typ": "JWT", "kid": key_id(public_key(key))}
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": tenant, "iat": now, "exp": now + round(days * 86_400)}
    signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims))
    with tempfile.NamedTemporaryFile() as message:
        message.write(signing_input.encode("ascii"))
        message.flush()
        signature = _openssl("pkeyutl", "-sign", "-inkey", str(key), "-rawin", "-in", message.name)
    if len(signature) != 64:
        raise TokenError(f"openssl returned a {len(signature)}-byte signature, not an Ed25519 one")
    return f"{signing_input}.{_b64url(signature)}"
