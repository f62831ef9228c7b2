"""Runs the rule engine on every closed window, in event-time order, inside the writer.

Transitions go to ``ttft.alerts`` (the durable outbox the delivery loop reads; produced and acknowledged
first) and then to the ``alerts`` table; canary verdicts go to ``canary_verdicts``; every rule evaluation
goes to ``rule_evaluations`` and, keyed by series, to the compacted ``ttft.rule-evaluations`` topic, which
``ttft rules status`` reads while this process holds the embedded store. All tables are idempotent, so
re-evaluating after a crash writes nothing new. Evaluations are counted on ``/metrics``
(``ttft_rule_evaluations{rule,outcome}``).

At start-up the engine is rebuilt by evaluating the stored windows of its look-back again, in order,
without producing anything, except transitions the ``alerts`` table does not have yet (a crash between
closing a window and storing its alerts): those are produced then.

A ``TTFTStageRegression`` going to ``firing`` gets one more description line before it is produced: its
short span's stored requests (stable arm only, like the rule), replayed with the stage back at its baseline
(:mod:`streams.rules.regression_replay`). The read happens only then, a few times a day at most, so the
writer keeps no request in memory for it; its records are in the store before their window closes.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from typing import Any

import orjson

from streams.alerting.outbox import alert_message
from streams.app.metrics import WorkerMetrics
from streams.app.window_closer import Publish, StoreCall, WindowCloser
from streams.core.whatif import WhatIfRefused
from streams.core.windows import WindowAggregates
from streams.rules import AlertTransition, RuleEngine, WindowEvaluation, WindowSnapshot, rules_config
from streams.rules.regression_replay import replay_span, wants_replay, with_baseline_replay
from streams.settings import Settings
from streams.store.aggregates_store import fetch_window_rows, insert_rows, stored_alert_keys
from streams.store.request_columns import read_request_columns

log = logging.getLogger("ttft.alerting")

_MAX_EMPTY_WINDOWS = 1_440  # never step through more than a day of empty windows at once


class AlertingHook:
    """Feeds closed windows to the :class:`RuleEngine` and stores what it decides."""

    def __init__(
        self,
        settings: Settings,
        metrics: WorkerMetrics,
        store_call: StoreCall,
        publish: Publish,
        flush: Any,
        *,
        muted: bool = False,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store_call = store_call
        self.publish = publish
        self.flush = flush
        self.muted = muted
        self.engine = RuleEngine(rules_config(settings.rules), settings)
        self.window_ms = settings.windows.window_s * 1000
        self.grace_ms = settings.windows.grace_s * 1000
        self.last_evaluated: int | None = None
        #: Window starts evaluated live, in order (bounded; for tests and the backfill check).
        self.evaluated: deque[int] = deque(maxlen=10_000)
        self.db = settings.clickhouse_database

    def attach(self, closer: WindowCloser) -> None:
        self.engine.use_tenants(closer.tenants)
        closer.hooks.append(self.on_window)
        closer.watermark_hooks.append(self.on_watermark)

    # --- start-up -------------------------------------------------------------------------------

    async def rebuild(self, closer: WindowCloser) -> None:
        """Replay the stored, closed windows of the look-back through the engine."""
        self.engine.use_tenants(closer.tenants)  # loaded by closer.recover: the silence rule watches them
        if closer.watermark is None:
            return
        closed = sorted(closer.closed)
        if not closed:
            return
        history = self._history_windows()
        until = closed[-1] + self.window_ms
        since = max(closed[0], until - history * self.window_ms)
        rows = await self.store_call(fetch_window_rows, self.db, since, until)
        have = await self.store_call(stored_alert_keys, self.db, since)
        missing: list[AlertTransition] = []
        ws = since
        while ws < until:
            snap = rows.get(ws)
            evaluation = self.engine.evaluate_window(ws, snap or WindowSnapshot(), muted=self.muted)
            missing += [t for t in evaluation.transitions if (t.fingerprint, t.state, round(t.event_at)) not in have]
            ws += self.window_ms
        self.last_evaluated = until - self.window_ms
        if missing:
            log.warning("alerting: %d transitions were not stored before the restart; producing them", len(missing))
            missing = await self._with_replays(missing, {})
            await self._emit(WindowEvaluation(float(self.last_evaluated), transitions=missing))
        log.info("alerting: engine rebuilt over %d windows", (until - since) // self.window_ms)

    def _history_windows(self) -> int:
        return self.engine.config.history_windows() + 1

    # --- live -----------------------------------------------------------------------------------

    async def on_window(self, ws: int, agg: WindowAggregates, first_close: bool, arms: dict[Any, Any]) -> None:
        if not first_close:
            return  # a late amendment is stored, not judged again: transitions stay deterministic
        await self._evaluate_empty_until(ws)
        if self.last_evaluated is not None and ws <= self.last_evaluated:
            return
        snap = WindowSnapshot(
            stage_windows=agg.stage_windows,
            stage_strata=agg.stage_strata,
            window_health=agg.window_health,
            llm_signals=agg.llm_signals,
            arms=arms,
            tail_attribution=agg.tail_attribution,
        )
        evaluation = self.engine.evaluate_window(ws, snap, muted=self.muted)
        evaluation.transitions = await self._with_replays(evaluation.transitions, arms)
        await self._emit(evaluation)
        self.last_evaluated = ws
        self.evaluated.append(ws)

    async def _with_replays(self, transitions: list[AlertTransition], arms: dict[Any, Any]) -> list[AlertTransition]:
        """Firing stage regressions with their baseline replay line (:mod:`streams.rules.regression_replay`)."""
        out = []
        for transition in transitions:
            if wants_replay(transition):
                transition = await self._with_replay(transition, arms)
            out.append(transition)
        return out

    async def _with_replay(self, transition: AlertTransition, arms: dict[Any, Any]) -> AlertTransition:
        tenant = transition.labels.get("tenant", "")
        canary = sorted(str(v) for (t, v), arm in arms.items() if t == tenant and arm == "canary")
        start, end = replay_span(transition, self.window_ms)
        read = functools.partial(read_request_columns, tenant=tenant, exclude_versions=canary)
        columns = await self.store_call(read, self.db, start, end)
        try:
            return with_baseline_replay(transition, columns)
        except (WhatIfRefused, ValueError):  # the alert goes out without its line rather than not at all
            log.warning("alerting: no baseline replay for %s", transition.labels, exc_info=True)
            return transition

    async def on_watermark(self, watermark: float, open_windows: set[int]) -> None:
        """Evaluate windows without any record once the watermark passed them (silence, Watchdog)."""
        due = int((watermark - self.window_ms - self.grace_ms) // self.window_ms * self.window_ms)
        if self.last_evaluated is None or due <= self.last_evaluated:
            return
        blocked = min(open_windows) if open_windows else None
        if blocked is not None and blocked <= due:
            due = blocked - self.window_ms
        await self._evaluate_empty_until(due + self.window_ms)

    async def _evaluate_empty_until(self, ws: int) -> None:
        if self.last_evaluated is None:
            return
        nxt = self.last_evaluated + self.window_ms
        if (ws - nxt) // self.window_ms > _MAX_EMPTY_WINDOWS:
            nxt = ws - _MAX_EMPTY_WINDOWS * self.window_ms
        while nxt < ws:
            await self._emit(self.engine.evaluate_window(nxt, WindowSnapshot(), muted=self.muted))
            self.last_evaluated = nxt
            self.evaluated.append(nxt)
            nxt += self.window_ms

    async def _emit(self, evaluation: WindowEvaluation) -> None:
        topic = self.settings.topic("alerts")
        for t in evaluation.transitions:
            key, value = alert_message(t)
            await self.publish(topic, key, value)
            self.metrics.alerts_sent.labels(t.state).inc()
            if t.muted:
                self.metrics.paging_muted.inc()
        status_topic = self.settings.topic("rule-evaluations")
        for e in evaluation.evaluations:
            await self.publish(status_topic, e.key.encode(), orjson.dumps(e.to_message()))
            self.metrics.rule_evaluations.labels(e.rule, e.outcome).inc()
        await self.flush()
        if evaluation.transitions:
            await self.store_call(insert_rows, self.db, "alerts", [t.to_row() for t in evaluation.transitions])
        if evaluation.verdicts:
            await self.store_call(insert_rows, self.db, "canary_verdicts", [v.to_row() for v in evaluation.verdicts])
        if evaluation.evaluations:
            rows = [e.to_row() for e in evaluation.evaluations]
            await self.store_call(insert_rows, self.db, "rule_evaluations", rows)
