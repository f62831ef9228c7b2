"""Issue 8, security: the pipeline over a SASL listener, and secrets kept out of argv, logs and errors.

A dedicated local broker offers PLAINTEXT (for the test's own observation) and SASL_PLAINTEXT with PLAIN and
SCRAM-SHA-256 for one user. The workers reach Kafka only through the SASL listener: the join (Faust) with
SCRAM-SHA-256 and the writer (aiokafka) with PLAIN, so one run covers both mechanisms and both clients.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from streams.alerting.alertmanager import AlertmanagerClient
from streams.kafka.broker import LocalBroker, missing_prerequisite
from streams.kafka.topics import kafka_client_kwargs
from streams.ports import free_port
from streams.settings import Settings, load_settings
from streams.store.client import StoreUnavailable, make_client
from tests.integration.test_pipeline_e2e import _check_store
from tests.support.pipeline import REPO, Pipeline, WorkerProcess, group_lag, pipeline_env
from tests.support.traffic import build_traffic

SASL_USER = "ttft-svc"


def _marker(kind: str) -> str:
    # Unique per run, so a hit can only come from this run's secret.
    return f"{kind}-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalBroker, str]]:
    """A broker with a SASL_PLAINTEXT listener for ``SASL_USER``; yields it and the user's password."""
    if reason := missing_prerequisite():
        pytest.skip(f"no local Kafka broker: {reason}")
    password = _marker("sasl")
    broker = LocalBroker(
        tmp_path_factory.mktemp("sasl") / "broker",
        sasl_users={SASL_USER: password},
        heap_mb=384,
        jvm_options=["-XX:TieredStopAtLevel=1"],
    )
    broker.start()
    try:
        yield broker, password
    finally:
        broker.stop(timeout_s=10)


def _sasl_settings(broker: LocalBroker, password: str, mechanism: str, tmp_path: Path) -> Settings:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    assert broker.sasl_bootstrap is not None
    return load_settings(
        kafka_bootstrap=broker.sasl_bootstrap,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism=mechanism,
        kafka_sasl_username=SASL_USER,
        kafka_sasl_password=SecretStr(password),
        home=tmp_path,
        topic_prefix=prefix,
        app_id=prefix,
    )


def _start_worker(pipe: Pipeline, role: str, mechanism: str) -> WorkerProcess:
    """Like ``Pipeline.start``, at log level info: more log lines, more chances for a secret to show."""
    port = free_port()
    log_path = pipe.home / f"{role}-{port}.log"
    cmd = [sys.executable, "-m", "streams.cli.main", "worker", "--role", role, "--log-level", "info"]
    cmd += ["--metrics-port", str(port), "--worker-id", f"{role}-{port}"]
    env = {**pipe.env, "TTFT_KAFKA_SASL_MECHANISM": mechanism}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    worker = WorkerProcess(role, proc, port, log_path)
    pipe.workers.append(worker)
    return worker


async def _produce(settings: Settings, messages: list[tuple[bytes | None, bytes]]) -> None:
    producer = AIOKafkaProducer(linger_ms=5, acks="all", **kafka_client_kwargs(settings))
    await producer.start()
    try:
        pending = [await producer.send(settings.topic("stage-events"), value=v, key=k) for k, v in messages]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _leaked(data: str | bytes, secrets: list[str]) -> list[str]:
    """The secrets any 12-character piece of which occurs in ``data`` (a truncated echo is a leak too)."""
    raw = data.encode() if isinstance(data, str) else data
    return [s[:8] + "…" for s in secrets if any(s[i : i + 12].encode() in raw for i in range(len(s) - 11))]


def _files_leaking(root: Path, secrets: list[str]) -> list[str]:
    return [
        f"{path.relative_to(root)}: {hit}"
        for path in root.rglob("*")
        if path.is_file()
        for hit in _leaked(path.read_bytes(), secrets)
    ]


@pytest.mark.kafka
@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_pipeline_over_sasl_stores_every_request_and_leaks_no_secret(
    sasl_broker: tuple[LocalBroker, str], tmp_path: Path
) -> None:
    broker, password = sasl_broker
    ch_password = _marker("ch")
    settings = _sasl_settings(broker, password, "SCRAM-SHA-256", tmp_path)
    env = pipeline_env(
        settings,
        tmp_path,
        TTFT_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        TTFT_KAFKA_SASL_MECHANISM="SCRAM-SHA-256",  # the writer overrides it with PLAIN
        TTFT_KAFKA_SASL_USERNAME=SASL_USER,
        TTFT_KAFKA_SASL_PASSWORD=password,
        # The embedded chDB store needs no credentials; set them anyway, as a deployment would.
        TTFT_CLICKHOUSE_USER="ttft_writer",
        TTFT_CLICKHOUSE_PASSWORD=ch_password,
    )
    secrets = [password, ch_password]
    traffic = build_traffic(1_000, start_ms=time.time() * 1000 - 60_000, spacing_ms=2.0, prefix="sasl")
    pipe = Pipeline(env, tmp_path)
    app = env["TTFT_APP_ID"]
    try:
        writer = _start_worker(pipe, "writer", "PLAIN")
        join = _start_worker(pipe, "join", "SCRAM-SHA-256")
        pipe.wait_healthy(writer)
        pipe.wait_healthy(join)
        for worker in (writer, join):
            argv = Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes()
            assert _leaked(argv, secrets) == [], f"secret in the argv of {worker.role}"
        asyncio.run(_produce(settings, traffic.messages))

        def _drained() -> bool:
            # Observed through the PLAINTEXT listener: the test's reads must not depend on the code under test.
            b = broker.bootstrap
            return (
                group_lag(b, f"{app}-join", [settings.topic("stage-events")]) == 0
                and join.metric("ttft_open_requests") == 0
                and group_lag(b, f"{app}-writer", [settings.topic("requests"), settings.topic("dead-letter")]) == 0
            )

        pipe.wait_for(_drained, 240, "the SASL pipeline to drain")
        assert pipe.stop(join) == 0
        assert pipe.stop(writer) == 0
    finally:
        pipe.stop_all()
    _check_store(pipe, traffic)
    # Every file the run wrote: worker logs (stdout + stderr), run files, worker data, the store.
    assert _files_leaking(tmp_path, secrets) == []


@pytest.mark.kafka
@pytest.mark.timeout(180)
def test_wrong_sasl_password_fails_without_echoing_it(sasl_broker: tuple[LocalBroker, str], tmp_path: Path) -> None:
    broker, _ = sasl_broker
    wrong = _marker("wrong")
    settings = _sasl_settings(broker, wrong, "SCRAM-SHA-256", tmp_path)
    env = pipeline_env(
        settings,
        tmp_path,
        TTFT_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        TTFT_KAFKA_SASL_USERNAME=SASL_USER,
        TTFT_KAFKA_SASL_PASSWORD=wrong,
    )
    pipe = Pipeline(env, tmp_path)
    writer = _start_worker(pipe, "writer", "SCRAM-SHA-256")
    try:
        rc = writer.proc.wait(timeout=120)
    finally:
        pipe.stop_all()
    log = writer.log()
    assert rc != 0
    assert "uthentication" in log, log[-2000:]
    assert _leaked(log, [wrong]) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["worker", "--role", "writer"], id="invalid-config"),
        pytest.param(["db", "migrate"], id="store-unreachable"),
    ],
)
@pytest.mark.net
def test_cli_errors_do_not_echo_secrets(args: list[str], tmp_path: Path) -> None:
    sasl, ch, url = _marker("sasl"), _marker("ch"), _marker("url")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    # Few settings, secrets last: what a short deployment env looks like, and where pydantic's truncated
    # input repr shows them. SASL without a mechanism is invalid; the store URL is a closed loopback port.
    env.update(
        PYTHONPATH=str(REPO),
        TTFT_HOME=str(tmp_path),
        TTFT_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT" if args[0] == "worker" else "PLAINTEXT",
        TTFT_KAFKA_SASL_PASSWORD=sasl,
        TTFT_CLICKHOUSE_URL=f"http://writer:{url}@127.0.0.1:{free_port()}",
        TTFT_CLICKHOUSE_PASSWORD=ch,
    )
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", *args], env=env, cwd=REPO, capture_output=True, timeout=90
    )
    text = (out.stdout + out.stderr).decode(errors="replace")
    assert out.returncode != 0, text
    assert _leaked(text, [sasl, ch, url]) == [], text[-2000:]


@pytest.mark.net
def test_clickhouse_connection_error_hides_password(caplog: pytest.LogCaptureFixture) -> None:
    url_secret, ch_secret = _marker("url"), _marker("ch")
    caplog.set_level(logging.DEBUG)
    port = free_port()
    for s in (
        load_settings(clickhouse_url=SecretStr(f"http://writer:{url_secret}@127.0.0.1:{port}")),
        load_settings(clickhouse_url=SecretStr(f"http://127.0.0.1:{port}"), clickhouse_password=SecretStr(ch_secret)),
    ):
        with pytest.raises(StoreUnavailable) as info:
            make_client(s)
        assert "127.0.0.1" in str(info.value)
        for text in (str(info.value), repr(info.value), caplog.text):
            assert _leaked(text, [url_secret, ch_secret]) == []


@pytest.mark.net
def test_alertmanager_delivery_errors_hide_url_credentials(caplog: pytest.LogCaptureFixture) -> None:
    secret = _marker("am")
    caplog.set_level(logging.DEBUG)

    async def post() -> bool:
        async with AlertmanagerClient(f"http://am:{secret}@127.0.0.1:{free_port()}", attempts=1) as client:
            return await client.post([{"labels": {"alertname": "Watchdog"}}])

    assert asyncio.run(post()) is False
    assert "unreachable" in caplog.text
    assert _leaked(caplog.text, [secret]) == []
