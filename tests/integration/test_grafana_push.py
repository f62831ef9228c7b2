"""``ttft grafana push`` against an HTTP server in the test that records every request.

Grafana cannot run on this machine (no Grafana binary or container engine), so the server below stands in
for the parts of Grafana's HTTP API that grafana-client calls: folders, data sources by uid and
dashboards by uid, with Grafana's status codes (404 for a missing object, 401 for bad credentials). It
keeps what is written, so a second push sees the first push's result. The test checks the paths,
methods and payloads of a first push, that a second push changes nothing, and the errors.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from click.testing import CliRunner, Result

from streams.cli.main import main
from streams.grafana.build import config_settings, dashboard_models

#: The stand-in Grafana is an HTTP server on a loopback port in the test process.
pytestmark = pytest.mark.net

TOKEN = "glsa_test_token"


@dataclass
class FakeGrafana:
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)

    def handle(self, method: str, path: str, auth: str | None, body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, body))
        basic = "Basic " + base64.b64encode(b"admin:secret").decode()
        if auth not in (f"Bearer {TOKEN}", basic):
            return 401, {"message": "Unauthorized"}
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "folders"]:
            if method == "GET" and len(parts) == 3:
                found = self.folders.get(parts[2])
                return (200, found) if found else (404, {"message": "folder not found"})
            if method == "POST":
                self.folders[body["uid"]] = {"uid": body["uid"], "title": body["title"], "version": 1}
                return 200, self.folders[body["uid"]]
            if method == "PUT":
                self.folders[parts[2]]["title"] = body["title"]
                return 200, self.folders[parts[2]]
        if parts[:2] == ["api", "datasources"]:
            if method == "GET" and parts[2:3] == ["uid"]:
                found = self.datasources.get(parts[3])
                return (200, found) if found else (404, {"message": "Data source not found"})
            if method in ("POST", "PUT"):
                stored = {k: v for k, v in body.items() if k != "secureJsonData"}
                stored["secureJsonFields"] = {k: True for k in body.get("secureJsonData", {})}
                stored["id"] = 7
                self.datasources[body["uid"]] = stored
                return 200, {"datasource": stored, "message": "Datasource added"}
        if parts[:3] == ["api", "dashboards", "uid"] and method == "GET":
            found = self.dashboards.get(parts[3])
            return (200, found) if found else (404, {"message": "Dashboard not found"})
        if parts[:3] == ["api", "dashboards", "db"] and method == "POST":
            model = dict(body["dashboard"])
            previous = self.dashboards.get(model["uid"])
            model["id"] = 42
            model["version"] = (previous["dashboard"]["version"] + 1) if previous else 1
            self.dashboards[model["uid"]] = {"dashboard": model, "meta": {"folderUid": body["folderUid"]}}
            return 200, {"status": "success", "uid": model["uid"], "version": model["version"]}
        return 404, {"message": f"not found: {method} {path}"}


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, payload = fake.handle(self.command, self.path, self.headers.get("Authorization"), body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _push(url: str, *extra: str, **env: str) -> Result:
    base = {
        "TTFT_GRAFANA_TOKEN": "",
        "TTFT_GRAFANA_USER": "",
        "TTFT_GRAFANA_PASSWORD": "",
        "TTFT_GRAFANA_CLICKHOUSE_PASSWORD": "ro-secret",
        "TTFT_GRAFANA_CLICKHOUSE_URL": "",
    }
    base.update(env)
    args = ["grafana", "push", "--url", url, "--clickhouse-url", "http://clickhouse:8123", "--timeout", "5"]
    return CliRunner().invoke(main, [*args, *extra], env=base)


def test_first_push_creates_folder_datasource_and_dashboards(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    result = _push(url, TTFT_GRAFANA_TOKEN=TOKEN)
    assert result.exit_code == 0, result.output
    writes = [(m, p) for m, p, _ in fake.requests if m != "GET"]
    models = dashboard_models(config_settings())
    assert writes == [("POST", "/api/folders"), ("POST", "/api/datasources")] + [("POST", "/api/dashboards/db")] * len(
        models
    )
    reads = [p for m, p, _ in fake.requests if m == "GET"]
    assert reads[:2] == ["/api/folders/ttft", "/api/datasources/uid/ttft-clickhouse"]
    assert sorted(reads[2:]) == sorted(f"/api/dashboards/uid/{m['uid']}" for m in models.values())

    bodies = [b for m, _, b in fake.requests if m != "GET"]
    assert bodies[0] == {"title": "TTFT", "uid": "ttft"}
    datasource = bodies[1]
    assert datasource["uid"] == "ttft-clickhouse" and datasource["type"] == "grafana-clickhouse-datasource"
    assert datasource["jsonData"] == {
        "host": "clickhouse",
        "port": 8123,
        "protocol": "http",
        "secure": False,
        "username": "grafana_ro",
        "defaultDatabase": "ttft",
        "dialTimeout": "10",
        "queryTimeout": "60",
    }
    assert datasource["secureJsonData"] == {"password": "ro-secret"}
    for body in bodies[2:]:
        assert body["folderUid"] == "ttft" and body["overwrite"] is True
        assert body["dashboard"] == {**models[f"{_slug(models, body['dashboard']['uid'])}"], "id": None}
    assert "created   folder ttft" in result.output
    assert f"{2 + len(models)} created, 0 updated, 0 unchanged" in result.output
    assert "ro-secret" not in result.output and TOKEN not in result.output


def _slug(models: dict[str, dict[str, Any]], uid: str) -> str:
    return next(name for name, model in models.items() if model["uid"] == uid)


def test_second_push_changes_nothing_and_says_so(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    assert _push(url, TTFT_GRAFANA_TOKEN=TOKEN).exit_code == 0
    fake.requests.clear()
    result = _push(url, TTFT_GRAFANA_TOKEN=TOKEN)
    assert result.exit_code == 0, result.output
    assert [m for m, _, _ in fake.requests] == ["GET"] * len(fake.requests)
    assert "nothing changed: Grafana already matches" in result.output


def test_push_updates_only_what_drifted(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    assert _push(url, TTFT_GRAFANA_TOKEN=TOKEN).exit_code == 0
    fake.dashboards["ttft-canary"]["dashboard"]["title"] = "edited in the UI"
    fake.requests.clear()
    result = _push(url, TTFT_GRAFANA_USER="admin", TTFT_GRAFANA_PASSWORD="secret")
    assert result.exit_code == 0, result.output
    assert [(m, p) for m, p, _ in fake.requests if m != "GET"] == [("POST", "/api/dashboards/db")]
    assert "updated   dashboard ttft-canary" in result.output
    assert "0 created, 1 updated" in result.output


def test_refused_credentials_fail_clearly(grafana: tuple[FakeGrafana, str]) -> None:
    _, url = grafana
    result = _push(url, TTFT_GRAFANA_TOKEN="wrong")
    assert result.exit_code != 0
    assert "refused the credentials (HTTP 401)" in result.output
    assert "wrong" not in result.output


def test_missing_credentials_fail_before_any_request(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    result = _push(url)
    assert result.exit_code != 0 and "no Grafana credentials" in result.output
    assert fake.requests == []


def test_credentials_in_the_url_are_refused(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    result = _push(url.replace("http://", "http://admin:secret@"), TTFT_GRAFANA_TOKEN=TOKEN)
    assert result.exit_code != 0 and "not in the URL" in result.output
    assert fake.requests == []


def test_unreachable_grafana_fails_clearly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    result = _push(f"http://127.0.0.1:{port}", TTFT_GRAFANA_TOKEN=TOKEN)
    assert result.exit_code != 0
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in result.output
