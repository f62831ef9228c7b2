"""What the demo shows while it runs: ``ttft top`` frames on a terminal, plain progress lines otherwise.

The view folds the aggregate topics (``ttft.stage-windows``, ``ttft.window-health``, ``ttft.alerts``)
exactly as ``ttft top`` does (:class:`streams.views.top.TopModel`; no database access) and adds a
header: which part of the story the producer is at, and which part the pipeline has reached (the newest
closed window). Every alert that starts firing is announced once with an ``alert fired:`` line (from
``ttft.alerts``), and every Alertmanager notification of a firing alert with ``alertmanager paged:``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from streams.demo.pipeline import PipelineProgress
from streams.demo.plan import DemoPlan
from streams.settings import Settings
from streams.views.top import TopFrame, TopModel, render_frame
from streams.views.top_feed import TopicFeed

PLAIN_EVERY_S: Final = 5.0
_PANEL_LINES: Final = 11


def clock(ms: float | None) -> str:
    """Event time as ``HH:MM`` UTC."""
    return "--:--" if not ms else datetime.fromtimestamp(ms / 1000.0, UTC).strftime("%H:%M")


def describe_labels(labels: dict[str, Any]) -> str:
    """``tenant=acme stage=ttft version=v13 severity=page`` (identity labels, in a fixed order)."""
    order = ("tenant", "stage", "version", "severity")
    return " ".join(f"{k}={labels[k]}" for k in order if labels.get(k))


class DemoView:
    """The live view of one demo run. Call :meth:`start`, then :meth:`tick` about once a second."""

    def __init__(self, console: Console, plan: DemoPlan, settings: Settings, *, live: bool) -> None:
        self.console = console
        self.plan = plan
        self.settings = settings
        self.live = live
        self.model = TopModel(window_ms=settings.windows.window_s * 1000, span_ms=5 * 60_000)
        self.feed = TopicFeed(settings, self.model, start_ms=None)
        self.stage = "starting"
        self.produced = 0
        self.produced_ts: float | None = None
        self.progress: PipelineProgress | None = None
        self.announced: set[str] = set()
        self.paged: set[tuple[str, str]] = set()
        self._started = time.monotonic()
        self._last_line = 0.0
        self._display: Live | None = None
        self._lock = threading.Lock()
        self._pending_lines: list[str] = []

    async def start(self) -> None:
        """Attach to the aggregate topics (they exist once the writer is healthy) and open the display."""
        await self.feed.start()
        if self.live:
            self._display = Live(self._render(), console=self.console, auto_refresh=False, transient=True)
            self._display.start()

    async def stop(self) -> None:
        """Close the display and the consumer; print what is still pending."""
        if self._display is not None:
            self._display.stop()
            self._display = None
        self._flush_lines()
        await self.feed.stop()

    # --- inputs ---------------------------------------------------------------------------------

    def on_produced(self, sent: int, last_ts_ms: float) -> None:
        """Producer progress callback (events sent, emission time of the last one)."""
        self.produced = sent
        self.produced_ts = last_ts_ms

    def on_webhook_alert(self, alert: dict[str, Any]) -> None:
        """Alertmanager notification (webhook thread): announce each firing alert once."""
        labels = alert.get("labels") or {}
        if alert.get("status") != "firing" or not isinstance(labels, dict):
            return
        key = (str(labels.get("alertname")), describe_labels(labels))
        with self._lock:
            if key in self.paged:
                return
            self.paged.add(key)
            who = "paged (no Alertmanager)" if alert.get("direct") else "alertmanager paged"
            self._pending_lines.append(f"{who}: {key[0]} {key[1]}")

    # --- refresh --------------------------------------------------------------------------------

    async def tick(self, progress: PipelineProgress | None, poll_s: float = 0.5) -> None:
        """Fold what arrived on the topics, announce new alerts, redraw (or print a plain line)."""
        deadline = time.monotonic() + poll_s
        while time.monotonic() < deadline:
            if not await self.feed.poll(timeout_ms=max(1, int(1000 * min(0.2, deadline - time.monotonic())))):
                break
        if progress is not None:
            self.progress = progress
        self._announce_alerts()
        self._flush_lines()
        if self._display is not None:
            self._display.update(self._render(), refresh=True)
        elif time.monotonic() - self._last_line >= PLAIN_EVERY_S:
            self._last_line = time.monotonic()
            self.console.print(self.status_line(), markup=False, highlight=False)

    def _announce_alerts(self) -> None:
        for fp, msg in self.model.alerts.items():
            if msg.get("state") != "firing" or fp in self.announced:
                continue
            self.announced.add(fp)
            labels = dict(msg.get("labels") or {})
            summary = str(dict(msg.get("annotations") or {}).get("summary", ""))
            at = msg.get("fired_at") or msg.get("active_at")
            line = f"alert fired: {msg.get('alertname')} {describe_labels(labels)} (event time {clock(at)})"
            with self._lock:
                self._pending_lines.append(line + (f": {summary}" if summary else ""))

    def _flush_lines(self) -> None:
        with self._lock:
            lines, self._pending_lines = self._pending_lines, []
        for line in lines:
            self.console.print(line, markup=False, highlight=False, style="bold red" if self.live else None)

    def status_line(self) -> str:
        """One plain progress line: producer, pipeline, alerts."""
        elapsed = time.monotonic() - self._started
        made = self.plan.phase_at(self.produced_ts) if self.produced_ts else None
        parts = [f"[{elapsed:5.0f}s] {self.stage}"]
        if self.produced:
            parts.append(
                f"produced {self.produced:,}/~{self.plan.expected_events:,} events "
                f"(event time {clock(self.produced_ts)}, {made.label if made else 'end of story'})"
            )
        p = self.progress
        if p is not None:
            reached = self.plan.phase_at(p.watermark_ms) if p.watermark_ms else None
            parts.append(
                f"pipeline: {p.records_written:,.0f} requests stored, {p.windows_closed:,.0f} windows closed, "
                f"lag {p.join_lag:,} events / {p.writer_lag:,} records, "
                f"at {clock(p.watermark_ms)} ({reached.label if reached else '-'})"
            )
        firing = sum(1 for m in self.model.alerts.values() if m.get("state") == "firing")
        parts.append(f"alerts firing {firing}")
        return " · ".join(parts)

    def _render(self) -> RenderableType:
        frame = self.model.frame(self.settings.slo_ms)
        fits = max(1, (self.console.height - 6) // _PANEL_LINES)
        shown: TopFrame = replace(frame, tenants=frame.tenants[:fits])
        header = Text(self.status_line(), style="bold")
        more = len(frame.tenants) - len(shown.tenants)
        extra = [Text(f"(+{more} more tenants: a taller terminal shows them)", style="dim")]
        return Group(header, render_frame(shown), *(extra if more > 0 else []))
