"""Property: no secret from any URL form ever appears in an error, a log line or ``/metrics``.

URL forms: every scheme the settings take, a user or none, a password that is raw (any characters,
including ``/ ? # @ :`` and a leading number, so ``user:2024/Secret@host`` parses as host ``user``, port
2024) or percent-encoded, IPv4, IPv6 and named hosts, numeric, missing and bad ports, paths and query
strings. Sinks: :func:`redact_url`, :func:`redact_password`, the settings summary, settings validation,
``ttft grafana push`` (its errors and output), store connection errors, the writer's retry log and
``/metrics`` + ``/healthz``.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from streams.app.metrics import WorkerMetrics
from streams.app.writer import StoreWriter
from streams.cli.grafana_cmd import grafana
from streams.grafana.push import PushError, connect, datasource_model
from streams.settings import Settings, load_settings, redact_password, redact_url, settings_summary
from streams.store.client import StoreConfigError, StoreUnavailable, make_client

MARK = "Zq7v"  # every generated secret starts with this, and nothing else in a URL holds it

_password_chars = st.text(st.characters(codec="utf-8", exclude_characters="\x00\r\n"), min_size=0, max_size=24)


@st.composite
def url_forms(draw: st.DrawFn) -> tuple[str, list[str]]:
    """(URL, the secret spellings that must never show)."""
    secret = MARK + draw(_password_chars)
    prefix = draw(st.sampled_from(["", "2024/", "12?", "8443#", "80/x@"]))
    raw = prefix + secret
    quoted = urllib.parse.quote(raw, safe="")
    password = draw(st.sampled_from([raw, quoted]))
    user = draw(st.sampled_from(["", "writer", "w%40x", "u"]))
    scheme = draw(st.sampled_from(["http", "https", "chdb", "native"]))
    host = draw(st.sampled_from(["127.0.0.1", "db.example", "[::1]", ""]))
    port = draw(st.sampled_from(["", ":9", ":8123", ":80x"]))
    tail = draw(st.sampled_from(["", "/", "/x", "/?secure=true", "/?ca_cert=/etc/a@b.pem", "?x=1#frag"]))
    url = f"{scheme}://{user}:{password}@{host}{port}{tail}"
    # What must not leak: the secret as written and decoded (a prefix of digits may legitimately look
    # like a port, so only the marked part is checked).
    return url, sorted({secret, urllib.parse.quote(secret, safe=""), password[len(prefix) :]} - {""})


def _clean(text: str, secrets: list[str]) -> None:
    leaked = [s for s in secrets if MARK in s and s in text]
    assert not leaked, f"leaked {leaked!r} in {text[:400]!r}"


@settings(max_examples=400, derandomize=True, deadline=None)
@given(form=url_forms())
def test_redaction_and_summaries_never_show_the_secret(form: tuple[str, list[str]]) -> None:
    url, secrets = form
    _clean(redact_url(url), secrets)
    _clean(redact_password(f"cannot connect to {url}: refused ({url})", url), secrets)
    try:
        summary = settings_summary(load_settings(clickhouse_url=SecretStr(url), alertmanager_url=url))
    except ValidationError as exc:
        _clean(str(exc), secrets)
        _clean(repr(exc.errors()), secrets)
    else:
        _clean(repr(summary), secrets)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(form=url_forms())
def test_grafana_push_errors_never_show_the_secret(form: tuple[str, list[str]]) -> None:
    url, secrets = form
    for call in (lambda: connect(url, {"TTFT_GRAFANA_TOKEN": "t"}), lambda: datasource_model(url, "ttft", None)):
        try:
            call()
        except PushError as exc:
            _clean(str(exc), secrets)


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(form=url_forms())
def test_grafana_push_cli_never_echoes_the_secret(form: tuple[str, list[str]]) -> None:
    url, secrets = form
    if "db.example" in url:
        return  # no DNS in unit tests: the loopback forms cover the network path
    result = CliRunner().invoke(
        grafana,
        ["push", "--url", url, "--clickhouse-url", url, "--timeout", "0.5"],
        env={"TTFT_GRAFANA_TOKEN": "t"},
    )
    _clean(result.output, secrets)
    _clean(repr(result.exception), secrets)


@pytest.mark.net
@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(form=url_forms())
def test_store_errors_retry_logs_and_metrics_never_show_the_secret(
    form: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    url, secrets = form
    if "db.example" in url or url.startswith("chdb"):
        return  # no DNS, and one chDB directory per process: the other forms are the network path
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    try:
        s = load_settings(clickhouse_url=SecretStr(url))
    except ValidationError as exc:
        _clean(str(exc), secrets)
        return
    error: BaseException | None = None
    try:
        make_client(s)
    except (StoreConfigError, StoreUnavailable) as exc:
        error = exc
        _clean(str(exc), secrets)
    metrics = WorkerMetrics("writer", "w1")
    if isinstance(error, StoreUnavailable):  # retried by the writer (a config error is not)
        asyncio.run(_retry_once(s, metrics, error))
    _clean(caplog.text, secrets)
    _clean(metrics.render().decode(), secrets)
    _clean(repr(metrics.health), secrets)


async def _retry_once(s: Settings, metrics: WorkerMetrics, error: BaseException) -> Any:
    """The writer's retry loop logs and counts the store error once, then succeeds."""
    writer = StoreWriter(s, metrics, stats_interval_s=None)
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise error
        return 1

    original = asyncio.sleep

    async def no_wait(_: float) -> None:
        await original(0)

    asyncio.sleep = no_wait  # type: ignore[assignment]
    try:
        return await writer._retry("connect", flaky)
    finally:
        asyncio.sleep = original  # type: ignore[assignment]
        writer.executor.shutdown(wait=True)
