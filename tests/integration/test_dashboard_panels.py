"""Every dashboard panel's SQL, expanded with the plugin's exact macros, on a store the real pipeline filled.

The store is the session's ``pipeline_run`` (broker, join and writer workers over simulated traffic; the
writer has exited). chDB allows one data directory per process, so ``tests/support/panel_check.py`` runs
every panel in a subprocess, once, at a 1 h range, a 24 h range and a 24 h range with one tenant, version
and stage selected, and compares percentile columns with numpy (``method='lower'``) over ``requests`` (the
what-if panel with the pure replay of the same requests).
Each test below judges one panel (or variable, annotation, alert rule) in that report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.grafana.build import repo_settings
from streams.grafana.model import FORMAT_TIME_SERIES, slugify
from tests.support.board_links import check_report_links
from tests.support.pipeline import REPO

# The first test's setup may include the session's pipeline run (minutes on a loaded machine): the
# panel checks themselves take about half a minute.
pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.e2e, pytest.mark.timeout(1200)]

RUNS = ("1h", "24h", "24h-selected")
#: Sources the join and the writer always fill: panels reading them must have rows at 24 h.
CORE_SOURCES = ("stage_windows", "window_health", "llm_signals", "requests", "tail_attribution")
NUMERIC = re.compile(r"^(Nullable\()?(U?Int\d+|Float\d+|Decimal.*|Bool)\)?$")
STRING = re.compile(r"^(LowCardinality\()?(Nullable\()?String\)?\)?$")
DATETIME = re.compile(r"^DateTime(64)?(\(.*\))?$")


def _panel_ids() -> list[str]:
    ids = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        model = json.loads(path.read_text(encoding="utf-8"))
        ids += [f"{path.stem}/{slugify(p['title'])}" for p in model["panels"]]
        ids += [f"{path.stem}/var-{v['name']}" for v in model["templating"]["list"] if v.get("type") == "query"]
        ids += [f"{path.stem}/annotation-{slugify(a['name'])}" for a in model["annotations"]["list"] if "target" in a]
    return ids


def _rule_ids() -> list[str]:
    document = yaml.safe_load((REPO / "deploy/grafana/provisioning/alerting/rules.yaml").read_text("utf-8"))
    return [r["uid"] for g in document["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def report(pipeline_run: Any) -> dict[str, Any]:
    start, end = pipeline_run.time_range_ms
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests/support/panel_check.py"),
            "--data-from-ms",
            str(int(start)),
            "--data-to-ms",
            str(int(end)),
        ],
        env=pipeline_run.env,
        cwd=REPO,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    data: dict[str, Any] = json.loads(out.stdout.decode())
    return data


def _check_columns(panel_id: str, entry: dict[str, Any]) -> None:
    columns = entry["columns"]
    names = [name for name, _ in columns]
    if "spec_columns" in entry:
        assert names == entry["spec_columns"], panel_id
    if entry.get("format") == FORMAT_TIME_SERIES:
        # A time column first, numbers to plot, string labels for the long-to-wide split.
        assert names[0] == "time" and DATETIME.match(columns[0][1]), columns
        types = [t for _, t in columns[1:]]
        assert any(NUMERIC.match(t) for t in types), columns
        assert all(NUMERIC.match(t) or STRING.match(t) for t in types), columns


@pytest.mark.parametrize("panel_id", _panel_ids())
def test_panel(report: dict[str, Any], panel_id: str) -> None:
    for run in RUNS:
        entry = report["runs"][run][panel_id]
        assert "error" not in entry, f"{run}: {entry.get('error')}"
        if entry["rows"]:
            _check_columns(panel_id, entry)
        if "expected_rows" in entry and run != "24h-selected":
            # Rows exactly where the data says there should be.
            assert (entry["rows"] > 0) == (entry["expected_rows"] > 0), (run, entry)
        percentiles = entry.get("percentiles")
        if percentiles is not None:
            assert percentiles["failures"] == [], (run, percentiles)
            assert percentiles["missing_keys"] == [] and percentiles["extra_keys"] == [], (run, percentiles)
            assert (percentiles["compared"] > 0) == (entry["rows"] > 0), (run, percentiles)
            assert percentiles["max_rel_err"] <= 0.01 + 1e-9
        whatif = entry.get("whatif")
        if whatif is not None:
            # The what-if panel against the pure replay of the same requests (exact, both sides).
            assert whatif["failures"] == [], (run, whatif)
            assert whatif["missing_keys"] == [] and whatif["extra_keys"] == [], (run, whatif)
            assert (whatif["compared"] > 0) == (entry["rows"] > 0), (run, whatif)
            if entry["rows"] and run == "24h":
                assert len(whatif["series"]) == 7, whatif  # observed and each of the six lever stages
    day = report["runs"]["24h"][panel_id]
    if "/var-" in panel_id:
        # Free-form ids (tenant, version) are (value = hex of the id, text = the id): streams.grafana.sql.
        names = [n for n, _ in day["columns"]]
        assert day["rows"] > 0 and names in (["value", "text"], [names[0]]), names
        assert all(STRING.match(t) for _, t in day["columns"])
    elif "/annotation-" in panel_id:
        assert [n for n, _ in day["columns"]] == ["time", "text", "tags"] and day["rows"] > 0
    elif set(re.findall(r"\bFROM\s+(\w+)", _raw_sql(panel_id))) & set(CORE_SOURCES):
        # Sources every pipeline run fills: the panel must show data at both ranges.
        assert day["rows"] > 0 and report["runs"]["1h"][panel_id]["rows"] > 0


def _raw_sql(panel_id: str) -> str:
    dashboard, _, slug = panel_id.partition("/")
    model = json.loads((REPO / "dashboards" / f"{dashboard}.json").read_text(encoding="utf-8"))
    (panel,) = [p for p in model["panels"] if slugify(p["title"]) == slug]
    return str(panel["targets"][0]["rawSql"])


@pytest.mark.parametrize("rule_uid", _rule_ids())
def test_grafana_alert_rule_query(report: dict[str, Any], rule_uid: str) -> None:
    entry = report["alert_rules"][rule_uid]
    assert "error" not in entry, entry.get("error")
    assert entry["paused"] is True
    if entry["row_count"]:
        # Grafana's table-alert contract: one numeric column, string labels, unique label sets.
        numeric = [n for n, t in entry["columns"] if NUMERIC.match(t)]
        labels = [i for i, (_, t) in enumerate(entry["columns"]) if STRING.match(t)]
        assert len(numeric) == 1 and len(labels) == len(entry["columns"]) - 1, entry["columns"]
        keys = [tuple(row[i] for i in labels) for row in entry["rows"]]
        assert len(set(keys)) == len(keys)


def test_every_link_with_the_stores_real_ids(report: dict[str, Any]) -> None:
    # Each data link rendered from rows the panels returned (tenant, version, request and trace ids of the
    # pipeline's traffic, a non-ASCII tenant among them) opens an existing board with its variables.
    assert check_report_links(report, REPO / "dashboards", repo_settings(), slugify) >= 30


def test_report_covers_every_panel(report: dict[str, Any]) -> None:
    for run in RUNS:
        assert set(report["runs"][run]) == set(_panel_ids())
    assert report["selected"]["tenant"], "the selected run picked a tenant"
    assert report["runs"]["24h-selected"]["ttft-request/request"]["rows"] == 1, "the chosen request is shown"
    assert Path(REPO / "dashboards").is_dir()
