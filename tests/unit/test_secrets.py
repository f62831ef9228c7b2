"""Secrets stay secret: settings reprs and dumps, URL redaction, the summary, configuration and store errors.

Each secret is a distinctive marker string, so "not in" cannot pass by accident on a short common word.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import clickhouse_connect
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from streams.alerting.alertmanager import AlertmanagerClient
from streams.settings import Settings, load_settings, redact_url, settings_summary
from streams.store.client import StoreConfigError, StoreUnavailable, make_client

SASL_SECRET = "sasl-S3cret-4f1e"
CH_SECRET = "ch-S3cret-9b2d"
URL_SECRET = "url-S3cret-77ac"
SECRETS = (SASL_SECRET, CH_SECRET, URL_SECRET)


def _secret_settings(**extra: Any) -> Settings:
    return load_settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="ttft",
        kafka_sasl_password=SecretStr(SASL_SECRET),
        clickhouse_url=SecretStr(f"http://writer:{URL_SECRET}@db.example:8123"),
        clickhouse_user="writer",
        clickhouse_password=SecretStr(CH_SECRET),
        **extra,
    )


def _assert_clean(text: str, secrets: tuple[str, ...] = SECRETS) -> None:
    leaked = [s for s in secrets if s in text]
    assert not leaked, f"leaked {leaked} in {text[:500]!r}"


# --- Settings -----------------------------------------------------------------------------------


def test_settings_repr_str_and_dumps_hide_secret_values() -> None:
    s = _secret_settings()
    _assert_clean(repr(s))
    _assert_clean(str(s))
    _assert_clean(s.model_dump_json())
    _assert_clean(str(s.model_dump(mode="json")))
    _assert_clean(str(s.model_dump()))  # python mode keeps SecretStr objects, whose str() is masked
    # The values are still there for the code that needs them.
    assert s.kafka_sasl_password is not None and s.kafka_sasl_password.get_secret_value() == SASL_SECRET
    assert URL_SECRET in s.store_url


def test_secrets_from_the_environment_are_secret_str(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TTFT_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TTFT_KAFKA_SASL_PASSWORD", SASL_SECRET)
    monkeypatch.setenv("TTFT_CLICKHOUSE_PASSWORD", CH_SECRET)
    monkeypatch.setenv("TTFT_CLICKHOUSE_URL", f"http://writer:{URL_SECRET}@db.example:8123")
    s = load_settings()
    assert isinstance(s.kafka_sasl_password, SecretStr)
    assert isinstance(s.clickhouse_password, SecretStr)
    _assert_clean(repr(s) + s.model_dump_json())


def test_validation_errors_do_not_echo_secret_input() -> None:
    with pytest.raises(ValueError) as info:
        # Missing mechanism: the cross-field check fails and pydantic reports the whole input.
        load_settings(
            kafka_security_protocol="SASL_PLAINTEXT",
            kafka_sasl_password=SASL_SECRET,
            clickhouse_password=CH_SECRET,
        )
    _assert_clean(str(info.value))


def test_alertmanager_url_credentials_do_not_show_in_settings_repr() -> None:
    s = load_settings(alertmanager_url=f"http://am:{URL_SECRET}@alerts.example:9093")
    _assert_clean(repr(s))
    _assert_clean(s.model_dump_json())
    assert s.alertmanager_url is not None
    assert s.alertmanager_url.get_secret_value() == f"http://am:{URL_SECRET}@alerts.example:9093"


def test_an_empty_alertmanager_url_still_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTFT_ALERTMANAGER_URL", "")  # what replay sets: no delivery loop
    s = load_settings()
    assert not s.alertmanager_url
    assert settings_summary(s)["alertmanager"] == "-"
    assert settings_summary(load_settings())["alertmanager"] == "-"


def test_alertmanager_invalid_url_errors_hide_credentials(caplog: pytest.LogCaptureFixture) -> None:
    # aiohttp's error for an unparsable URL is the URL itself; no connection is tried.
    caplog.set_level(logging.DEBUG)

    async def post(url: str) -> bool:
        async with AlertmanagerClient(url, attempts=1) as client:
            return await client.post([{"labels": {"alertname": "Watchdog"}}])

    for url in (f"http://am:{URL_SECRET}@127.0.0.1:80x", f"http://am:{URL_SECRET}/x@127.0.0.1:9"):
        caplog.clear()
        assert asyncio.run(post(url)) is False
        assert "unreachable" in caplog.text
        _assert_clean(caplog.text)


# --- redact_url and the summary -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (f"http://writer:{URL_SECRET}@db.example:8123", "http://writer:***@db.example:8123"),
        (f"https://writer:{URL_SECRET}@db.example/?verify=false", "https://writer:***@db.example/?verify=false"),
        (f"https://:{URL_SECRET}@db.example:8443", "https://***@db.example:8443"),
        (f"http://writer:{URL_SECRET}@with@db.example:8123", "http://writer:***@db.example:8123"),
        (f"http://writer:{urllib.parse.quote(URL_SECRET + '/@:', safe='')}@db.example", "http://writer:***@db.example"),
        (f"http://writer:{URL_SECRET}/x@db.example:8123", "http://writer:***@db.example:8123"),
        (f"http://writer:{URL_SECRET}?x#y@db.example:8123/", "http://writer:***@db.example:8123/"),
        (f"http://writer:{URL_SECRET}@db.example:80x", "http://writer:***@db.example:80x"),
        (f"http://writer:{URL_SECRET}@[::1]:8123", "http://writer:***@[::1]:8123"),
        (f"chdb://writer:{URL_SECRET}@/var/lib/ttft", "chdb://writer:***@/var/lib/ttft"),
        (f"http://writer:2024/{URL_SECRET}@db.example:8123/x", "http://writer:***@db.example:8123/x"),
        (f"http://writer:2024?{URL_SECRET}@db.example", "http://writer:***@db.example"),
        (f"http://:2024/{URL_SECRET}@db.example/?ca_cert=/a@b.pem", "http://***@db.example/?ca_cert=/a@b.pem"),
        # No host before the colon: the "query" is the password's (found by the property test in CI).
        (f"http://:12?{URL_SECRET}=@127.0.0.1", "http://***@127.0.0.1"),
        (f"chdb://writer:12?{URL_SECRET}=@127.0.0.1", "chdb://writer:***@127.0.0.1"),
        ("http://db.example:8123", "http://db.example:8123"),
        ("https://db.example:8443/?ca_cert=/etc/certs/a@b.pem", "https://db.example:8443/?ca_cert=/etc/certs/a@b.pem"),
        ("http://[::1]/?x=a@b", "http://[::1]/?x=a@b"),
        ("chdb:///var/lib/ttft/chdb", "chdb:///var/lib/ttft/chdb"),
        ("chdb:///var/lib/a:b@c", "chdb:///var/lib/a:b@c"),
        ("-", "-"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@settings(max_examples=200, derandomize=True, deadline=None)
@given(password=st.text(min_size=1, max_size=40), user=st.sampled_from(["", "writer", "w%40x"]))
def test_redact_url_never_returns_the_password(password: str, user: str) -> None:
    secret = "Pw7q" + password  # a prefix that appears nowhere else in the URL
    quoted = urllib.parse.quote(secret, safe="")
    out = redact_url(f"https://{user}:{quoted}@db.example:8443/?secure=true")
    assert secret not in out and quoted not in out
    assert out.endswith("db.example:8443/?secure=true")


def test_redact_url_survives_a_bad_port() -> None:
    out = redact_url(f"http://writer:{URL_SECRET}@db.example:80x")
    _assert_clean(out)
    with pytest.raises(StoreConfigError, match="bad port") as info:
        make_client(load_settings(clickhouse_url=SecretStr(f"http://writer:{URL_SECRET}@db.example:80x")))
    _assert_clean(str(info.value))


def test_store_errors_hide_a_password_with_an_unescaped_slash() -> None:
    with pytest.raises(StoreConfigError) as info:
        make_client(load_settings(clickhouse_url=SecretStr(f"http://writer:{URL_SECRET}/x@db.example:8123")))
    _assert_clean(str(info.value))


def test_settings_summary_is_secret_free() -> None:
    summary = settings_summary(_secret_settings(alertmanager_url=f"http://am:{URL_SECRET}@alerts.example"))
    _assert_clean(repr(summary))
    assert summary["clickhouse"] == "http://writer:***@db.example:8123"
    assert summary["alertmanager"] == "http://am:***@alerts.example"


def test_settings_summary_of_the_default_chdb_store(tmp_path: Any) -> None:
    summary = settings_summary(load_settings(home=tmp_path, clickhouse_password=SecretStr(CH_SECRET)))
    _assert_clean(repr(summary))
    assert summary["clickhouse"].startswith("chdb://")


# --- store client errors (no connection: the driver is replaced) --------------------------------


class _EchoingDriverError(Exception):
    """What a driver might raise: an error message that repeats its arguments."""


def _echoing_get_client(**kwargs: Any) -> Any:
    raise _EchoingDriverError(f"cannot connect with {kwargs!r}")


def test_http_client_error_scrubs_the_password_from_the_driver_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clickhouse_connect, "get_client", _echoing_get_client)
    for s in (
        load_settings(clickhouse_url=SecretStr(f"http://writer:{URL_SECRET}@db.example:8123")),
        load_settings(clickhouse_url=SecretStr("https://db.example"), clickhouse_password=SecretStr(CH_SECRET)),
        _secret_settings(),
    ):
        with pytest.raises(StoreUnavailable) as info:
            make_client(s)
        _assert_clean(str(info.value))
        assert info.value.__cause__ is None and info.value.__suppress_context__


def test_store_config_errors_redact_http_urls() -> None:
    for url in (
        f"https://writer:{URL_SECRET}@db.example:8443/ttft",  # database in the path
        f"ftp://writer:{URL_SECRET}@db.example",  # unsupported scheme
        f"http://writer:{URL_SECRET}@:8123",  # no host
    ):
        with pytest.raises(StoreConfigError) as info:
            make_client(load_settings(clickhouse_url=SecretStr(url)))
        _assert_clean(str(info.value))


def test_chdb_url_error_redacts_credentials() -> None:
    with pytest.raises(StoreConfigError) as info:
        make_client(load_settings(clickhouse_url=SecretStr(f"chdb://writer:{URL_SECRET}@/var/lib/ttft")))
    _assert_clean(str(info.value))
