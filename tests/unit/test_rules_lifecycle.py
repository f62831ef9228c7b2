from __future__ import annotations

import pytest

from streams.rules import ALERT_COLUMNS, AlertTransition, fingerprint, ingest_halted_transition
from streams.rules.lifecycle import AlertBook, Signal
from tests.unit.rules_synth import Scenario, Traffic, make_engine

KEY = ("TTFTStageRegression", "t1", "retrieval", "")


def steps(book: AlertBook, signals: list[Signal], **kwargs: object) -> list[list[str]]:
    out = []
    for i, signal in enumerate(signals):
        transitions = book.step(
            KEY,
            signal,
            float(i),
            severity="ticket",
            summary="s",
            description=f"d{i}",
            numbers={"ratio": 1.3},
            **kwargs,  # type: ignore[arg-type]
        )
        out.append([t.state for t in transitions])
    return out


def test_for_count_then_firing_then_hysteresis_hold_then_resolved() -> None:
    book = AlertBook("https://x/runbook.md")
    got = steps(book, ["breach", "breach", "hold", "breach", "hold", "clear"], for_windows=2)
    assert got == [["pending"], ["firing"], [], [], [], ["resolved"]]


def test_pending_that_clears_is_dropped_with_no_fired_at() -> None:
    book = AlertBook("https://x/runbook.md")
    transitions = book.step(KEY, "breach", 0.0, severity="page", summary="", description="", numbers={}, for_windows=3)
    transitions += book.step(KEY, "clear", 1.0, severity="page", summary="", description="", numbers={})
    assert [(t.state, t.fired_at) for t in transitions] == [("pending", None), ("resolved", None)]
    assert book.get(KEY) is None


def test_resolve_windows_needs_consecutive_clears() -> None:
    book = AlertBook("https://x/runbook.md")
    got = steps(book, ["breach", "clear", "breach", "clear", "clear"], resolve_windows=2)
    assert got == [["firing"], [], [], [], ["resolved"]]


def test_identity_is_the_labels_and_times_are_event_time() -> None:
    book = AlertBook("https://x/runbook.md")
    fired = book.step(KEY, "breach", 60_000.0, severity="page", summary="s", description="d", numbers={"r": 2.0})[0]
    resolved = book.step(KEY, "clear", 180_000.0, severity="page", summary="s", description="d", numbers={})[0]
    assert fired.labels == {
        "alertname": "TTFTStageRegression",
        "tenant": "t1",
        "stage": "retrieval",
        "severity": "page",
    }
    assert fired.fingerprint == resolved.fingerprint == fingerprint(dict(reversed(list(fired.labels.items()))))
    assert (fired.active_at, fired.fired_at, resolved.resolved_at) == (60_000.0, 60_000.0, 180_000.0)
    assert resolved.fired_at == 60_000.0
    assert fired.annotations["runbook_url"] == "https://x/runbook.md#ttftstageregression"


def test_message_round_trip_and_table_row() -> None:
    t = ingest_halted_transition("firing", 120_000.0, detail="70 % dead letters", numbers={"share": 0.7})
    assert AlertTransition.from_message(t.to_message()) == t
    row = t.to_row()
    assert tuple(row) == ALERT_COLUMNS
    assert row["state"] == "firing" and row["fingerprint"] == t.fingerprint and row["event_at"] == row["fired_at"]
    resolved = ingest_halted_transition("resolved", 240_000.0, fired_at_ms=120_000.0)
    assert resolved.fingerprint == t.fingerprint and resolved.resolved_at == 240_000.0
    with pytest.raises(ValueError):
        AlertTransition.from_message({**t.to_message(), "state": "exploded"})


def test_muted_evaluation_marks_transitions_and_restore_resumes_firing_alerts() -> None:
    scenario = Scenario(seed=4, arms={("t1", "v1"): "stable"})
    engine = make_engine()
    ws, snap = scenario.window(0, {"t1": {"v1": Traffic()}})
    muted = engine.evaluate(ws, snap, muted=True)
    assert muted and all(t.muted for t in muted)

    restarted = make_engine()
    stale = AlertTransition(
        "TTFTStageRegression",
        {"alertname": "TTFTStageRegression", "tenant": "t9", "stage": "retrieval", "severity": "page"},
        {},
        {},
        "firing",
        0.0,
        0.0,
        0.0,
    )
    assert restarted.restore([stale]) == 1
    resolved = []
    for i in range(1, 13):
        ws, snap = scenario.window(i, {"t1": {"v1": Traffic(n=100)}})
        resolved += [t for t in restarted.evaluate(ws, snap) if t.fingerprint == stale.fingerprint]
    # Tenant t9 never reports again: the restored alert resolves after stale_windows, not never.
    assert [(t.state, t.window_start) for t in resolved] == [("resolved", 10 * 60_000.0)]


def test_every_alert_has_a_runbook_section_its_url_points_to() -> None:
    from pathlib import Path

    from streams.rules import ALERT_NAMES

    runbook = (Path(__file__).resolve().parents[2] / "docs" / "runbook.md").read_text()
    headings = {line[3:].strip() for line in runbook.splitlines() if line.startswith("## ")}
    assert set(ALERT_NAMES) <= headings
    book = AlertBook("https://example/docs/runbook.md")
    assert book.runbook_url("TTFTSLOBurn").endswith("runbook.md#ttftsloburn")
