from __future__ import annotations

import orjson

from streams.rules.model import RuleEvaluation
from streams.sim.detection import make_engine
from streams.sim.rule_windows import ArmTraffic, WindowSource
from streams.views.rule_status import fold_statuses, render_status, status_rows


def messages(windows: int) -> list[bytes | None]:
    arms = {("busy", "v1"): "stable", ("quiet", "v1"): "stable", ("quiet", "v2"): "canary"}
    source, engine = WindowSource(5, arms), make_engine()  # type: ignore[arg-type]
    traffic = {
        ("busy", "v1"): ArmTraffic(100.0, {}),
        ("quiet", "v1"): ArmTraffic(0.2, {}),
        ("quiet", "v2"): ArmTraffic(0.05, {}),
    }
    out: list[bytes | None] = []
    for i in range(windows):
        ws, snap = source.window(i, traffic)
        out += [orjson.dumps(e.to_message()) for e in engine.evaluate_window(ws, snap).evaluations]
    return out


def test_status_keeps_the_newest_evaluation_per_series_and_skips_malformed_ones() -> None:
    values = messages(95)
    statuses = fold_statuses([*values, b"{not json", None])
    reg = statuses["quiet|TTFTStageRegression|retrieval|"]
    assert reg.window_start == 94 * 60_000.0
    assert reg.outcome == "insufficient_traffic" and reg.span_windows == 30 and 0 < reg.samples < 400
    assert reg.last_decided_at is None
    busy = statuses["busy|TTFTStageRegression|retrieval|"]
    assert busy.outcome == "ok" and busy.span_windows == 1 and busy.last_decided_at == busy.window_start
    canary = statuses["quiet|TTFTCanaryFailed|llm_ttft|v2"]
    assert canary.outcome == "insufficient_traffic" and canary.span_windows == 60


def test_status_table_per_tenant_says_what_could_not_decide_and_since_when() -> None:
    statuses = fold_statuses(messages(95))
    text = render_status(status_rows(statuses, tenant="quiet"))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["tenant", "rule", "stage", "version"]
    assert all(line.startswith("quiet") for line in lines[1:])
    row = next(line for line in lines if "TTFTStageRegression" in line and "retrieval" in line)
    assert "INSUFFICIENT_TRAFFIC" in row and "30 w" in row and row.rstrip().endswith("never")
    assert "TTFTCanaryFailed" in text and "TTFTSLOBurn" not in text
    assert "TTFTSLOBurn" in render_status(status_rows(statuses, all_rules=True))
    busy = render_status(status_rows(statuses, tenant="busy"))
    assert " ok " in busy and busy.splitlines()[1].rstrip().endswith("now")


def test_evaluation_message_round_trips() -> None:
    e = RuleEvaluation("TTFTCanaryFailed", "t", "ttft", "v2", "insufficient_traffic", 60_000.0, 12, 340, 0.0)
    assert RuleEvaluation.from_message(orjson.loads(orjson.dumps(e.to_message()))) == e
    assert set(e.to_row()) == {
        "window_start",
        "tenant_id",
        "rule",
        "stage",
        "version_id",
        "outcome",
        "span_windows",
        "samples",
        "last_decided_at",
    }
