"""Authenticated tenants (docs/otlp-mapping.md): ``otlp.tenant_source: resource`` reads a span's tenant from
its resource's ``tenant.id`` alone; the tenants' bearer tokens (streams/otel/tokens.py) and their CLI; the
overlay's names agree with the token module's. The real Collector: tests/integration/test_otel_auth_tenants.py.
"""

from __future__ import annotations

import base64
import json
import random
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from schemas.otlp import parse_spans
from streams.cli.main import main
from streams.core.otlp_mapping import own_tenant
from streams.otel.collector import AUTH_OVERLAY, DEFAULT_CONFIG, LocalCollector
from streams.otel.tokens import AUDIENCE, ISSUER, TokenError, make_keys, mint
from streams.settings import OtelCollectorConfig, load_settings
from tests.support.otlp_traffic import build_trace, request_message

START_US = 1_764_000_000_000_000


def _message(resource_tenant: str | None, span_tenants: dict[str, str]) -> bytes:
    """One trace; ``tenant.id`` on the resource (or none), and ``span_tenants`` on every span."""
    spec = build_trace(random.Random(2), 2, START_US, shape="gen_ai", tenant=resource_tenant or "x")
    spec.tenant_on_resource = resource_tenant is not None
    msg = request_message(spec, spec.spans)
    for span in msg.resource_spans[0].scope_spans[0].spans:
        for key, value in span_tenants.items():
            span.attributes.append(KeyValue(key=key))
            span.attributes[-1].value.string_value = value
    return msg.SerializeToString()


def _tenants(raw: bytes, source: Any) -> set[str]:
    return {own_tenant(dict(s.attributes)) for s in parse_spans(raw, "otlp_proto", source)}


def test_resource_source_ignores_every_tenant_claim_on_spans() -> None:
    claims = {"tenant.id": "globex", "ttft.tenant_id": "initech"}
    raw = _message("acme", claims)
    assert _tenants(raw, "attributes") == {"initech"}  # the span's ttft.tenant_id wins
    assert _tenants(raw, "resource") == {"acme"}
    spans = parse_spans(raw, "otlp_proto", "resource")
    assert all("ttft.tenant_id" not in s.attributes and s.attributes["tenant.id"] == "acme" for s in spans)
    assert all(s.ignored_tenant_claim for s in spans)  # counted: ttft_otlp_tenant_claims_ignored
    assert not any(s.ignored_tenant_claim for s in parse_spans(raw, "otlp_proto", "attributes"))
    same = parse_spans(_message("acme", {"tenant.id": "acme"}), "otlp_proto", "resource")
    assert not any(s.ignored_tenant_claim for s in same)  # a claim of its own tenant is no claim


def test_resource_source_drops_ttft_tenant_id_on_the_resource_and_fails_closed_without_a_resource_tenant() -> None:
    raw = _message(None, {"tenant.id": "globex"})
    assert _tenants(raw, "attributes") == {"globex"}
    assert _tenants(raw, "resource") == {""}  # no tenant: the stage spans dead-letter missing_tenant
    assert all(s.ignored_tenant_claim for s in parse_spans(raw, "otlp_proto", "resource"))


def _claims(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    def part(text: str) -> dict[str, Any]:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))  # type: ignore[no-any-return]

    header, payload, _ = token.split(".")
    return part(header), part(payload)


def test_a_token_is_an_eddsa_jwt_of_its_tenant_that_openssl_verifies(tmp_path: Path) -> None:
    keys = make_keys(tmp_path)
    assert stat.S_IMODE(keys.key.stat().st_mode) == 0o600
    (jwk,) = json.loads(keys.jwks.read_text())["keys"]
    assert (jwk["kty"], jwk["crv"], jwk["alg"]) == ("OKP", "Ed25519", "EdDSA") and "d" not in jwk
    token = mint(keys.key, "acme", days=2, now_s=1_800_000_000)
    header, claims = _claims(token)
    assert header == {"alg": "EdDSA", "typ": "JWT", "kid": jwk["kid"]}
    assert claims == {"iss": ISSUER, "aud": AUDIENCE, "sub": "acme", "iat": 1_800_000_000, "exp": 1_800_172_800}
    # The signature verifies against the JWKS key alone (SubjectPublicKeyInfo = fixed prefix + raw key).
    raw = base64.urlsafe_b64decode(jwk["x"] + "=")
    der = bytes.fromhex("302a300506032b6570032100") + raw
    (tmp_path / "pub.der").write_bytes(der)
    signing_input, _, signature = token.rpartition(".")
    (tmp_path / "msg").write_bytes(signing_input.encode())
    (tmp_path / "sig").write_bytes(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    verify = ["openssl", "pkeyutl", "-verify", "-pubin", "-keyform", "DER", "-inkey", str(tmp_path / "pub.der")]
    verify += ["-rawin", "-in", str(tmp_path / "msg"), "-sigfile", str(tmp_path / "sig")]
    assert subprocess.run(verify, capture_output=True, check=False).returncode == 0
    forged = {**claims, "sub": "globex"}
    forged_payload = base64.urlsafe_b64encode(json.dumps(forged, separators=(",", ":")).encode()).rstrip(b"=")
    (tmp_path / "msg").write_bytes(signing_input.split(".")[0].encode() + b"." + forged_payload)
    assert subprocess.run(verify, capture_output=True, check=False).returncode != 0


@pytest.mark.parametrize("tenant", ["", "a b", "x" * 65, "__other__", "tab\there"])
def test_no_token_for_what_is_no_tenant_id(tmp_path: Path, tenant: str) -> None:
    keys = make_keys(tmp_path)
    with pytest.raises(TokenError, match="not a tenant id"):
        mint(keys.key, tenant)


def test_a_key_is_never_replaced_silently(tmp_path: Path) -> None:
    first = make_keys(tmp_path).jwks.read_text()
    with pytest.raises(TokenError, match="invalidates every token"):
        make_keys(tmp_path)
    assert make_keys(tmp_path, overwrite=True).jwks.read_text() != first


def test_cli_keys_then_token(tmp_path: Path) -> None:
    env = {"TTFT_HOME": str(tmp_path)}
    made = CliRunner().invoke(main, ["otel", "keys"], env=env)
    assert made.exit_code == 0, made.output
    jwks = tmp_path / "otel-auth" / "tenant-tokens.jwks"
    assert str(jwks) in made.output
    token = CliRunner().invoke(main, ["otel", "token", "globex", "--days", "30"], env=env)
    assert token.exit_code == 0, token.output
    assert _claims(token.stdout.strip())[1]["sub"] == "globex"
    again = CliRunner().invoke(main, ["otel", "keys"], env=env)
    assert again.exit_code == 1 and "--overwrite" in again.output
    bad = CliRunner().invoke(main, ["otel", "token", "a b"], env=env)
    assert bad.exit_code == 1 and "not a tenant id" in bad.output


def test_auth_keys_setting_adds_the_overlay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.cli.otel_cmd import _collector

    monkeypatch.setenv("TTFT_HOME", str(tmp_path))
    assert _collector(load_settings()).overlays == ()
    monkeypatch.setenv("TTFT_OTEL__AUTH_KEYS", str(tmp_path / "k.jwks"))
    collector = _collector(load_settings())
    assert collector.overlays == (AUTH_OVERLAY.resolve(),)
    assert collector.environment()["TTFT_OTEL__AUTH_KEYS"] == str(tmp_path / "k.jwks")
    ports = LocalCollector(tmp_path, ports=OtelCollectorConfig(), kafka_bootstrap="x").ports.ports()
    assert set(ports) == {"grpc_port", "http_port", "prometheus_port", "telemetry_port"}


def test_the_overlay_names_the_token_modules_issuer_and_audience_and_sets_the_tenant_before_batch() -> None:
    overlay = yaml.safe_load(AUTH_OVERLAY.read_text())
    (provider,) = overlay["extensions"]["oidc/tenants"]["providers"]
    assert (provider["issuer_url"], provider["audience"]) == (ISSUER, AUDIENCE)
    assert provider["public_keys_file"] == "${env:TTFT_OTEL__AUTH_KEYS}"  # the setting otel.auth_keys
    protocols = overlay["receivers"]["otlp"]["protocols"]
    assert {p["auth"]["authenticator"] for p in protocols.values()} == {"oidc/tenants"} and len(protocols) == 2
    actions = overlay["processors"]["resource/auth_tenant"]["attributes"]
    assert {"key": "tenant.id", "from_context": "auth.subject", "action": "upsert"} in actions
    assert overlay["service"]["pipelines"]["traces"]["processors"] == ["resource/auth_tenant", "batch"]
    base = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert set(base["receivers"]["otlp"]["protocols"]) == set(protocols)
