"""Alertmanager for the demo: Debian's ``prometheus-alertmanager`` routing to a recording webhook.

The webhook runs in the demo process (a thread) and keeps every notification, so the demo can say which
alerts actually paged. Alertmanager listens on a free loopback port, with clustering off (its default
cluster port 9094 and Kafka's favourite 9093 are never touched) and 1 s group timers: production values
are minutes, a compressed demo has seconds.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from streams.demo.processes import ChildProcess, ProcessSet, wait_http_ok
from streams.ports import free_port

ALERTMANAGER_BINARY = "prometheus-alertmanager"
#: Alertmanager's API v2 endpoint the writer posts alerts to (streams/alerting/alertmanager.py).
API_ALERTS_PATH = "/api/v2/alerts"


def notification_of_api_alerts(alerts: list[Any], now: datetime) -> dict[str, Any]:
    """API v2 alert objects as one webhook notification: firing until ``endsAt``, resolved from then on;
    each marked ``direct`` (no Alertmanager delivered it)."""
    out = []
    for alert in alerts:
        if not isinstance(alert, dict):
            continue
        try:
            ends = datetime.fromisoformat(str(alert.get("endsAt", "")).replace("Z", "+00:00"))
        except ValueError:
            ends = None
        status = "resolved" if ends is not None and ends <= now else "firing"
        out.append({**alert, "status": status, "direct": True})
    return {"receiver": "demo-direct", "status": "firing", "alerts": out}


def find_alertmanager() -> str | None:
    """Path of the Alertmanager binary (``/usr/bin/prometheus-alertmanager`` on Debian), or None."""
    return shutil.which(ALERTMANAGER_BINARY) or (
        "/usr/bin/prometheus-alertmanager" if Path("/usr/bin/prometheus-alertmanager").is_file() else None
    )


class WebhookRecorder:
    """An HTTP server keeping every JSON notification Alertmanager posts; ``on_alert`` sees each alert.

    Without Alertmanager (not installed, or ``--no-alertmanager``) the writer is pointed at :attr:`api_url`
    instead: the recorder then also takes Alertmanager's own API, ``POST /api/v2/alerts``, and keeps each
    alert as a one-alert notification (``status`` firing, or resolved once ``endsAt`` has passed), so the
    demo's alerts still reach its webhook, without Alertmanager's grouping, routing or silences.
    """

    def __init__(self, on_alert: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.payloads: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    payload = json.loads(body or b"{}")
                except ValueError:
                    payload = {}
                if self.path.rstrip("/") == API_ALERTS_PATH and isinstance(payload, list):
                    recorder._record(notification_of_api_alerts(payload, datetime.now(UTC)))
                else:
                    recorder._record(payload if isinstance(payload, dict) else {})
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._on_alert = on_alert
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.url = f"{self.api_url}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-webhook", daemon=True)
        self._thread.start()

    def _record(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.payloads.append(payload)
        if self._on_alert is not None:
            for alert in payload.get("alerts") or []:
                if isinstance(alert, dict):
                    self._on_alert(alert)

    def alerts(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every alert of every notification so far, optionally only those with ``status``."""
        with self._lock:
            payloads = list(self.payloads)
        return [
            a
            for p in payloads
            for a in p.get("alerts") or []
            if isinstance(a, dict) and (status is None or a.get("status") == status)
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def alertmanager_config(webhook_url: str) -> str:
    """Everything to the webhook, grouped by alert identity, with demo-speed timers."""
    return (
        "route:\n"
        "  receiver: demo-webhook\n"
        "  group_by: [alertname, tenant, stage, version]\n"
        "  group_wait: 1s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: demo-webhook\n"
        "    webhook_configs:\n"
        f"      - url: '{webhook_url}'\n"
        "        send_resolved: true\n"
    )


def start_alertmanager(
    processes: ProcessSet, workdir: Path, webhook_url: str, binary: str, timeout_s: float = 30.0
) -> tuple[ChildProcess, str]:
    """Start Alertmanager on a free port under ``workdir``; returns the child and its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text(alertmanager_config(webhook_url))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = processes.start(
        "alertmanager",
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        env={"PATH": "/usr/bin:/bin"},
    )
    wait_http_ok(f"{url}/-/ready", timeout_s, alive=child, what="alertmanager")
    return child, url
