"""``ttft top``'s model and renderer: fold the aggregate topics into per-tenant panels (no database).

:class:`TopModel` folds messages of ``ttft.stage-windows`` (one ``stage_windows`` row each; JSON bin keys
are strings), ``ttft.window-health`` (a ``window_health`` row with ``llm_signals`` and
``tail_attribution`` riding along) and ``ttft.alerts`` (alert transitions). A re-published window (late
amendment, replay) replaces the earlier message of the same key when its ``computed_version`` is not
lower, so nothing is double-counted. :meth:`TopModel.frame` merges the newest ``span_ms`` of event time
with :func:`streams.core.sketch.merge_bins` semantics (via :mod:`streams.views.summary`) and the
renderers turn a :class:`TopFrame` into rich renderables or plain text. The Kafka side is
:mod:`streams.views.top_feed`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from streams.core.stages import TTFT
from streams.views.summary import (
    Completeness,
    StageStat,
    combine_attribution,
    fmt_ms,
    fmt_share,
    ordered_stages,
    stage_stats,
    sum_health,
    sum_signals,
)

KINDS: Final = ("stage-windows", "window-health", "alerts")
_STATE_RANK: Final = {"pending": 0, "firing": 1, "resolved": 2}
_BAR_WIDTH: Final = 28


def _int_bins(bins: Mapping[Any, Any]) -> dict[int, int]:
    return {int(k): int(v) for k, v in bins.items()}


def _event_at(msg: Mapping[str, Any]) -> float:
    state = msg.get("state")
    if state == "resolved" and msg.get("resolved_at") is not None:
        return float(msg["resolved_at"])
    if state == "firing" and msg.get("fired_at") is not None:
        return float(msg["fired_at"])
    return float(msg.get("active_at") or msg.get("window_start") or 0.0)


@dataclass(frozen=True, slots=True)
class ActiveAlert:
    """A pending or firing alert as the last transition on ``ttft.alerts`` left it."""

    alertname: str
    state: str
    labels: dict[str, str]
    summary: str
    since_ms: float

    def describe(self) -> str:
        labels = " ".join(f"{k}={v}" for k, v in self.labels.items() if k not in ("alertname", "tenant"))
        return f"{self.state.upper()} {self.alertname} {labels}".strip() + (f": {self.summary}" if self.summary else "")


@dataclass(frozen=True, slots=True)
class TenantPanel:
    """What ``ttft top`` shows for one tenant over the span."""

    tenant: str
    ttft: StageStat | None
    slo_ms: float
    stages: list[StageStat]
    biggest_p95_stage: str
    tail_dominant_stage: str
    cache_hit_rate: float | None
    draft_accept: dict[str, tuple[float | None, float | None, float]]
    completeness: Completeness
    alerts: list[ActiveAlert]

    @property
    def slo_bad_share(self) -> float | None:
        if self.ttft is None or not self.completeness.slo_total:
            return None
        return self.ttft.slo_bad_count / self.completeness.slo_total


@dataclass(frozen=True, slots=True)
class TopFrame:
    """One frame: the span (event time), a panel per tenant, tenant-less alerts and feed counters."""

    span_start_ms: int | None
    span_end_ms: int | None
    tenants: list[TenantPanel]
    global_alerts: list[ActiveAlert]
    messages: int
    bad_messages: int


@dataclass
class TopModel:
    """Folded state of the three topics, bounded to the newest ``span_ms`` of event time."""

    window_ms: int = 60_000
    span_ms: int = 300_000
    stage_rows: dict[tuple[str, str, str, int], dict[str, Any]] = field(default_factory=dict)
    health: dict[tuple[str, str, int], dict[str, Any]] = field(default_factory=dict)
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    newest_window: int | None = None
    messages: int = 0
    bad_messages: int = 0

    def fold(self, kind: str, value: bytes | None) -> None:
        """Fold one message of topic ``kind`` (see :data:`KINDS`); undecodable ones are counted, skipped."""
        try:
            msg = orjson.loads(value or b"")
            if not isinstance(msg, dict):
                raise TypeError("not an object")
            if kind == "stage-windows":
                self._fold_stage_window(msg)
            elif kind == "window-health":
                self._fold_window_health(msg)
            elif kind == "alerts":
                self._fold_alert(msg)
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
            self.bad_messages += 1
            return
        self.messages += 1

    @staticmethod
    def _newer(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
        return old is None or int(new.get("computed_version") or 0) >= int(old.get("computed_version") or 0)

    def _see_window(self, ws: int) -> bool:
        """Advance the span to ``ws`` if newer; whether a row of window ``ws`` belongs in the span.

        Partitions are read in no particular order, so older windows can arrive after newer ones."""
        if self.newest_window is None or ws > self.newest_window:
            self.newest_window = ws
            self._prune()
        first = self._first_window()
        return first is None or ws >= first

    def _fold_stage_window(self, msg: dict[str, Any]) -> None:
        ws = int(msg["window_start"])
        row = {
            **msg,
            "window_start": ws,
            "bins": _int_bins(msg["bins"]),
            "zero_count": int(msg["zero_count"]),
        }
        key = (str(msg["tenant_id"]), str(msg["version_id"]), str(msg["stage"]), ws)
        if self._see_window(ws) and self._newer(self.stage_rows.get(key), row):
            self.stage_rows[key] = row

    def _fold_window_health(self, msg: dict[str, Any]) -> None:
        ws = int(msg["window_start"])
        key = (str(msg["tenant_id"]), str(msg["version_id"]), ws)
        if self._see_window(ws) and self._newer(self.health.get(key), msg):
            self.health[key] = {**msg, "window_start": ws}

    def _fold_alert(self, msg: dict[str, Any]) -> None:
        if "alertname" not in msg or "state" not in msg:
            raise KeyError("alert message without alertname or state")
        fp = str(msg.get("fingerprint") or sorted(dict(msg["labels"]).items()))
        old = self.alerts.get(fp)
        rank = (_event_at(msg), _STATE_RANK.get(str(msg["state"]), -1))
        if old is None or rank >= (_event_at(old), _STATE_RANK.get(str(old["state"]), -1)):
            self.alerts[fp] = msg

    def _first_window(self) -> int | None:
        if self.newest_window is None:
            return None
        return self.newest_window - self.span_ms + self.window_ms

    def _prune(self) -> None:
        first = self._first_window()
        if first is None:
            return
        self.stage_rows = {k: v for k, v in self.stage_rows.items() if k[3] >= first}
        self.health = {k: v for k, v in self.health.items() if k[2] >= first}

    def _active_alerts(self) -> list[ActiveAlert]:
        out = []
        for msg in self.alerts.values():
            if msg.get("state") in ("pending", "firing"):
                annotations = dict(msg.get("annotations") or {})
                out.append(
                    ActiveAlert(
                        alertname=str(msg["alertname"]),
                        state=str(msg["state"]),
                        labels={str(k): str(v) for k, v in dict(msg["labels"]).items()},
                        summary=str(annotations.get("summary", "")),
                        since_ms=float(msg.get("active_at") or 0.0),
                    )
                )
        return sorted(out, key=lambda a: (a.state != "firing", a.alertname, sorted(a.labels.items())))

    def frame(self, slo_ms: Callable[[str], float]) -> TopFrame:
        """The current frame; ``slo_ms(tenant)`` gives a tenant's TTFT SLO (``Settings.slo_ms``)."""
        alerts = self._active_alerts()
        tenants = sorted(
            {k[0] for k in self.stage_rows}
            | {k[0] for k in self.health}
            | {a.labels["tenant"] for a in alerts if "tenant" in a.labels}
        )
        panels = [self._panel(t, slo_ms(t), [a for a in alerts if a.labels.get("tenant") == t]) for t in tenants]
        first = self._first_window()
        return TopFrame(
            span_start_ms=first,
            span_end_ms=None if self.newest_window is None else self.newest_window + self.window_ms,
            tenants=panels,
            global_alerts=[a for a in alerts if "tenant" not in a.labels and a.alertname != "Watchdog"],
            messages=self.messages,
            bad_messages=self.bad_messages,
        )

    def _panel(self, tenant: str, slo: float, alerts: list[ActiveAlert]) -> TenantPanel:
        stats = stage_stats(v for k, v in self.stage_rows.items() if k[0] == tenant)
        health = [v for k, v in self.health.items() if k[0] == tenant]
        attribution = [h["tail_attribution"] for h in health if h.get("tail_attribution")]
        signals = [h["llm_signals"] for h in health if h.get("llm_signals")]
        p95 = {s: st.p95 for s, st in stats.items()}
        tail = combine_attribution(attribution, p95)
        levers = sum_signals(signals)
        return TenantPanel(
            tenant=tenant,
            ttft=stats.get(TTFT),
            slo_ms=slo,
            stages=ordered_stages(stats),
            biggest_p95_stage=tail.biggest_p95_stage,
            tail_dominant_stage=tail.tail_dominant_stage,
            cache_hit_rate=levers.prompt_cache_hit_rate,
            draft_accept=levers.draft_accept,
            completeness=sum_health(health),
            alerts=alerts,
        )


# --- rendering ------------------------------------------------------------------------------------------


def _clock(ms: float | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000.0, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _bar(value: float | None, scale: float, ascii_only: bool, mark: float | None = None) -> str:
    """A fixed-width bar; ``mark`` (e.g. the SLO) is drawn as a tick at its position."""
    filled = 0 if not value or scale <= 0 else max(1, round(_BAR_WIDTH * min(value, scale) / scale))
    cells = [("#" if ascii_only else "█") if i < filled else " " for i in range(_BAR_WIDTH)]
    if mark is not None and scale > 0:
        cells[min(_BAR_WIDTH - 1, round(_BAR_WIDTH * mark / scale) - 1)] = "|" if ascii_only else "┃"
    return "".join(cells)


def render_panel(panel: TenantPanel, ascii_only: bool = False) -> RenderableType:
    """One tenant: TTFT P95 vs SLO, stage bars, biggest / tail-dominant, levers, completeness, alerts."""
    ttft_p95 = panel.ttft.p95 if panel.ttft is not None else None
    over = ttft_p95 is not None and ttft_p95 > panel.slo_ms
    head = Text.assemble(
        ("TTFT P95 ", "bold"),
        (fmt_ms(ttft_p95), "bold red" if over else "bold green"),
        f" vs SLO {fmt_ms(panel.slo_ms)} ({'|' if ascii_only else '┃'} in the TTFT bar)",
        (" OVER SLO" if over else " within SLO", "red" if over else "green"),
        f"   n={panel.ttft.count if panel.ttft else 0:,}   SLO-bad {fmt_share(panel.slo_bad_share)}",
    )
    scale = max([s.p95 or 0.0 for s in panel.stages] + [ttft_p95 or 0.0, panel.slo_ms])
    bars = Table.grid(padding=(0, 1))
    for name, justify in (("stage", "left"), ("p95", "right"), ("bar", "left"), ("n", "left")):
        bars.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in panel.stages:
        label = f"  {s.stage}" if s.kind == "sub" else s.stage
        style = "dim" if s.kind == "sub" else ("cyan" if s.kind == "parent" else "")
        bars.add_row(
            label,
            fmt_ms(s.p95),
            Text(_bar(s.p95, scale, ascii_only), style=style or "white"),
            f"n={s.count:,}",
        )
    if panel.ttft is not None:
        bars.add_row(
            Text("TTFT", style="bold"),
            fmt_ms(ttft_p95),
            Text(_bar(ttft_p95, scale, ascii_only, mark=panel.slo_ms), style="red" if over else "green"),
            f"n={panel.ttft.count:,}",
        )
    c = panel.completeness
    draft = ", ".join(f"{v} {p50:.2f}" for v, (p50, _p10, _ws) in panel.draft_accept.items() if p50 is not None)
    facts = Text(
        f"biggest P95: {panel.biggest_p95_stage or '-'}   tail-dominant: {panel.tail_dominant_stage or '-'}\n"
        f"cache hit rate {fmt_share(panel.cache_hit_rate)}   draft acceptance P50 {draft or '-'}\n"
        f"completeness {fmt_share(c.share('complete'))} of {c.total:,} (timed out "
        f"{fmt_share(c.share('timed_out'))}, orphan {fmt_share(c.share('orphan'))}, missing stage "
        f"{fmt_share(c.share('missing_stage'))}, no first chunk {fmt_share(c.share('no_first_chunk'))}, dead "
        f"letters {c.dead_letters:,})"
    )
    alert_lines = [Text(a.describe(), style="bold red" if a.state == "firing" else "yellow") for a in panel.alerts]
    body = Group(head, bars, facts, *(alert_lines or [Text("no active alerts", style="dim")]))
    return Panel(body, title=f"[bold]{panel.tenant}[/]", title_align="left", border_style="red" if over else "blue")


def render_frame(frame: TopFrame, ascii_only: bool = False) -> RenderableType:
    """The whole frame as one rich renderable."""
    header = Text(
        f"ttft top · event time {_clock(frame.span_start_ms)} → {_clock(frame.span_end_ms)} UTC · "
        f"{frame.messages:,} messages" + (f" ({frame.bad_messages} undecodable)" if frame.bad_messages else ""),
        style="bold",
    )
    parts: list[RenderableType] = [header]
    parts.extend(Text(f"pipeline: {a.describe()}", style="bold red") for a in frame.global_alerts)
    if not frame.tenants:
        parts.append(Text("waiting for ttft.stage-windows / ttft.window-health messages ...", style="dim"))
    parts.extend(render_panel(p, ascii_only) for p in frame.tenants)
    return Group(*parts)


def frame_text(frame: TopFrame, width: int = 110) -> str:
    """The frame as plain text (no colours, ASCII bars): for pipes, CI logs and tests."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, highlight=False)
    console.print(render_frame(frame, ascii_only=True))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]
