"""Run every dashboard panel's SQL on the configured store, as Grafana would, and print one JSON report.

    python tests/support/panel_check.py --data-from-ms A --data-to-ms B [--now-ms N]

Run as a separate process with the environment of the filled store (chDB allows one data directory per
process). For each run (1 h ending just after the traffic, 24 h ending now, and 24 h with one tenant,
version and stage selected) and each panel of ``dashboards/*.json``: the SQL is expanded exactly as the
plugin does (:func:`streams.grafana.macros.expand_query`, Grafana's interval for the panel), executed,
and its columns, row count and the panel's expectation count are reported. Percentile columns are
compared with numpy ``quantile(method='lower')`` over ``requests FINAL``. Variable and annotation
queries run too (ids ``<slug>/var-<name>`` and ``<slug>/annotation-<name>``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from streams.core.sketch import MIN_VALUE  # noqa: E402
from streams.grafana.build import dashboard_specs, repo_settings  # noqa: E402
from streams.grafana.macros import QueryContext, Variable, expand_query, panel_interval_ms  # noqa: E402
from streams.grafana.model import PercentileCheck, WhatIfCheck, slugify  # noqa: E402
from streams.store.shutdown import exit_process  # noqa: E402

STAGE_FIELDS = ("retrieval", "vector_recall", "bm25_recall", "rerank", "prompt_assemble", "llm_ttft")
SKETCHED = ("complete", "missing_stage")
REL_TOL = 0.01
#: Variables whose values are the hex of the id (``streams.grafana.sql.hex_variable_sql``).
HEX_VARIABLES = ("tenant", "version")


def hex_value(text: str) -> str:
    """The value a hex variable holds for ``text`` (ClickHouse ``hex()``: upper case)."""
    return text.encode("utf-8").hex().upper()


def unhex_value(value: str) -> str:
    return bytes.fromhex(value).decode("utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


class Reference:
    """``requests FINAL`` in memory: per record, the (stage, value) pairs the sketches take."""

    def __init__(self, client: Any) -> None:
        cols = ", ".join(f"{s}_ms" for s in STAGE_FIELDS)
        result = client.query(
            "SELECT toUnixTimestamp64Milli(window_start), tenant_id, version_id, status, "
            f"first_token_at IS NOT NULL, ttft_ms, other_ms, custom_stages, draft_accept_rate, {cols} "
            "FROM requests FINAL"
        )
        self.records: list[dict[str, Any]] = []
        for row in result.result_rows:
            ws, tenant, version, status, has_ft, ttft, other, custom, draft, *stages = row
            pairs: list[tuple[str, float]] = []
            if status in SKETCHED:
                pairs += [(s, float(v)) for s, v in zip(STAGE_FIELDS, stages, strict=True) if v is not None]
                if other is not None:
                    pairs.append(("other", max(float(other), 0.0)))
                pairs += [(str(k), max(float(v), 0.0)) for k, v in dict(custom).items()]
                if ttft is not None and has_ft:
                    pairs.append(("ttft", float(ttft)))
            if draft is not None:
                pairs.append(("draft_accept_rate", float(draft)))
            self.records.append({"ws": int(ws), "tenant_id": tenant, "version_id": version, "pairs": pairs})

    def groups(
        self, check: PercentileCheck, ctx: QueryContext, variables: dict[str, Variable], uses_stage_var: bool
    ) -> dict[tuple[Any, ...], list[float]]:
        """Values per (bucket?, labels..., stage) for the records the panel's filters select."""
        lo, hi = (ctx.from_ms // 1000) * 1000, (ctx.to_ms // 1000) * 1000
        step = max(ctx.interval_ms // 1000, 1)
        labels = [g for g in check.group if g != check.stage_column]
        wanted = {
            name: {unhex_value(v) if name in HEX_VARIABLES else v for v in variables[name].values}
            for name in ("tenant", "version", "stage")
            if name in variables and not variables[name].is_all
        }
        out: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for rec in self.records:
            if not lo <= rec["ws"] <= hi:
                continue
            if "tenant" in wanted and rec["tenant_id"] not in wanted["tenant"]:
                continue
            if "version" in wanted and rec["version_id"] not in wanted["version"]:
                continue
            base = ((rec["ws"] // 1000 // step) * step,) if check.by_time else ()
            base += tuple(rec[g] for g in labels)
            for stage, value in rec["pairs"]:
                if check.stage is not None and stage != check.stage:
                    continue
                if check.stage is None and stage == "draft_accept_rate":
                    continue
                if check.stages and stage not in check.stages:
                    continue
                if uses_stage_var and "stage" in wanted and stage not in wanted["stage"]:
                    continue
                out[(*base, stage)].append(value)
        return out


def compare(
    check: PercentileCheck, columns: list[str], rows: list[list[Any]], ref: dict[tuple[Any, ...], list[float]]
) -> dict[str, Any]:
    labels = [g for g in check.group if g != check.stage_column]
    stage_is_label = check.stage_column in check.group
    report: dict[str, Any] = {"compared": 0, "max_rel_err": 0.0, "failures": []}
    got_keys: set[tuple[Any, ...]] = set()
    for row in rows:
        rec = dict(zip(columns, row, strict=True))
        base = (int(_plain(rec["time"])),) if check.by_time else ()
        base += tuple(rec[g] for g in labels)
        stage = check.stage if check.stage is not None else rec[str(check.stage_column)]
        got_keys.add((*base, stage) if stage_is_label else base)
        values = ref.get((*base, stage), [])
        for column, q in check.columns.items():
            got = rec[column]
            if not values:
                report["failures"].append({"key": [*base, stage], "column": column, "got": got, "want": None})
                continue
            want = float(np.quantile(np.asarray(values), q, method="lower"))
            tol = REL_TOL * abs(want) + (MIN_VALUE if want <= MIN_VALUE else 1e-9 * abs(want))
            err = abs(float(got) - want) if got is not None else float("inf")
            report["compared"] += 1
            if want:
                report["max_rel_err"] = max(report["max_rel_err"], err / abs(want))
            if not err <= tol:
                report["failures"].append({"key": [*base, stage], "column": column, "got": got, "want": want})
        if check.argmax_over:
            p95 = {
                s: float(np.quantile(np.asarray(v), 0.95, method="lower"))
                for (*b, s), v in ref.items()
                if tuple(b) == base and v
            }
            if p95 and p95.get(str(stage), -1.0) < max(p95.values()) * (1 - 2 * REL_TOL):
                report["failures"].append({"key": list(base), "argmax": stage, "want_p95": p95})
    want_keys = {k if stage_is_label else k[:-1] for k, v in ref.items() if v}
    report["missing_keys"] = sorted(map(list, want_keys - got_keys), key=str)[:5]
    report["extra_keys"] = sorted(map(list, got_keys - want_keys), key=str)[:5]
    report["failures"] = report["failures"][:5]
    return report


class ReplayReference:
    """``requests FINAL``'s replayable requests, for what-if panels: per interval, the pure replay."""

    def __init__(self, client: Any) -> None:
        result = client.query(
            "SELECT toUnixTimestamp64Milli(window_start), tenant_id, version_id, status, first_token_at, ttft_ms, "
            f"recall_mode, {', '.join(f'{s}_ms' for s in STAGE_FIELDS)} FROM requests FINAL"
        )
        self.records = []
        for ws, tenant, version, status, first, ttft, mode, *stages in result.result_rows:
            record = {"ws": int(ws), "tenant_id": tenant, "version_id": version, "status": status}
            record |= {"first_token_at": first, "ttft_ms": ttft, "recall_mode": mode}
            record |= {f"{s}_ms": v for s, v in zip(STAGE_FIELDS, stages, strict=True)}
            self.records.append(record)

    def compare(
        self, check: WhatIfCheck, ctx: QueryContext, variables: dict[str, Variable], columns: list[str], rows: list[Any]
    ) -> dict[str, Any]:
        from streams.core.whatif import RequestColumns, replay
        from streams.core.whatif_levers import LEVER_STAGES, Scale
        from streams.core.whatif_stats import lower_quantiles

        lo, hi = (ctx.from_ms // 1000) * 1000, (ctx.to_ms // 1000) * 1000
        step = max(ctx.interval_ms // 1000, 1)
        wanted = {
            name: {unhex_value(v) if name in HEX_VARIABLES else v for v in variables[name].values}
            for name in ("tenant", "version", "stage")
            if name in variables and not variables[name].is_all
        }
        stages = [s for s in LEVER_STAGES if "stage" not in wanted or s in wanted["stage"]]
        scale = float(variables["scale"].values[0])
        buckets: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rec in self.records:
            if not lo <= rec["ws"] <= hi:
                continue
            if any(rec[f"{name}_id"] not in wanted[name] for name in ("tenant", "version") if name in wanted):
                continue
            buckets[(rec["ws"] // 1000 // step) * step].append(rec)
        want: dict[tuple[int, str], float] = {}
        for bucket, records in buckets.items():
            replayable = RequestColumns.from_records(records)
            if not replayable.n:
                continue
            want[(bucket, check.observed)] = lower_quantiles(replayable.ttft, [check.quantile])[0]
            for stage in stages:
                predicted = replay(replayable, [Scale(stage, scale)]).predicted
                want[(bucket, f"{stage} x{scale:g}")] = lower_quantiles(predicted, [check.quantile])[0]
        got = {}
        for row in rows:
            rec = dict(zip(columns, row, strict=True))
            got[(int(_plain(rec["time"])), str(rec[check.series_column]))] = float(rec[check.column])
        failures = [
            {"key": list(key), "got": got[key], "want": value}
            for key, value in sorted(want.items())
            if key in got and not abs(got[key] - value) <= 1e-9 * abs(value)
        ]
        return {
            "compared": len(want.keys() & got.keys()),
            "failures": failures[:5],
            "missing_keys": sorted(map(list, want.keys() - got.keys()), key=str)[:5],
            "extra_keys": sorted(map(list, got.keys() - want.keys()), key=str)[:5],
            "series": sorted({series for _, series in got}),
        }


def run_query(client: Any, sql: str) -> tuple[list[tuple[str, str]], list[list[Any]]]:
    result = client.query(sql)
    columns = [(name, str(t.name)) for name, t in zip(result.column_names, result.column_types, strict=True)]
    return columns, [list(r) for r in result.result_rows]


def queries(model: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any] | None]]:
    """(id suffix, rawSql, panel or None) for the panels, variables and annotations of a dashboard."""
    for panel in model["panels"]:
        yield slugify(panel["title"]), panel["targets"][0]["rawSql"], panel
    for var in model["templating"]["list"]:
        if var.get("type", "query") == "query":  # a custom variable's options are no query
            yield f"var-{var['name']}", var["query"], None
    for anno in model["annotations"]["list"]:
        if "target" in anno:
            yield f"annotation-{slugify(anno['name'])}", anno["target"]["rawSql"], None


def selection(client: Any) -> dict[str, Variable]:
    """One tenant (a non-ASCII one when there is one), its busiest version (plus its canary version, when
    it has one) and two stages."""
    tenants = [
        r[0]
        for r in client.query(
            "SELECT tenant_id, sum(total) AS n FROM window_health FINAL GROUP BY tenant_id ORDER BY n DESC"
        ).result_rows
    ]
    tenant = next((t for t in tenants if not t.isascii()), tenants[0])
    versions = [
        r[0]
        for r in client.query(
            "SELECT version_id FROM window_health FINAL WHERE tenant_id = {t:String} "
            "GROUP BY version_id ORDER BY sum(total) DESC LIMIT 1",
            parameters={"t": tenant},
        ).result_rows
    ]
    # Two versions when a canary exists (the canary panels filter canary_version by the same variable).
    versions += [
        r[0]
        for r in client.query(
            "SELECT DISTINCT canary_version FROM canary_verdicts FINAL WHERE tenant_id = {t:String} LIMIT 1",
            parameters={"t": tenant},
        ).result_rows
    ]
    hexed = tuple(hex_value(v) for v in versions)
    # A request of that tenant, not its slowest (the request board's default): the one with the smallest id.
    (request,) = client.query(
        "SELECT min(request_id) FROM requests FINAL WHERE tenant_id = {t:String}", parameters={"t": tenant}
    ).result_rows[0]
    return {
        "tenant": Variable("tenant", tuple(hex_value(t) for t in tenants), (hex_value(tenant),)),
        "version": Variable("version", hexed, hexed),
        "stage": Variable("stage", ("llm_ttft", "ttft"), ("llm_ttft", "ttft")),
        "request_id": Variable("request_id", (request,), (request,)),
    }


def _default(variable: dict[str, Any]) -> Variable:
    """A variable nobody chose: *All* for a query variable, its default value for a custom one."""
    if variable.get("type") == "custom":
        options = tuple(str(o["value"]) for o in variable["options"])
        return Variable(variable["name"], options, (str(variable["current"]["value"]),))
    if variable.get("type") == "textbox":  # its default text (the request board: empty, the slowest request)
        value = str(variable["current"]["value"])
        return Variable(variable["name"], (value,), (value,))
    return Variable(variable["name"], ())


def check_alert_rules(client: Any, to_ms: int) -> dict[str, Any]:
    """Run each provisioned Grafana alert rule's query over its relative time range ending at ``to_ms``."""
    import yaml

    document = yaml.safe_load((REPO / "deploy/grafana/provisioning/alerting/rules.yaml").read_text("utf-8"))
    out: dict[str, Any] = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            query = rule["data"][0]
            span = query["relativeTimeRange"]
            ctx = QueryContext(to_ms - span["from"] * 1000, to_ms - span["to"] * 1000, query["model"]["intervalMs"])
            entry: dict[str, Any] = {"paused": rule.get("isPaused")}
            try:
                columns, rows = run_query(client, expand_query(query["model"]["rawSql"], ctx))
                entry |= {"columns": columns, "rows": _plain(rows[:20]), "row_count": len(rows)}
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
            out[rule["uid"]] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-from-ms", type=int, required=True)
    parser.add_argument("--data-to-ms", type=int, required=True)
    parser.add_argument("--now-ms", type=int, default=None)
    args = parser.parse_args()

    from streams.settings import load_settings
    from streams.store.client import make_client

    settings = load_settings()
    client = make_client(settings)
    client.database = settings.clickhouse_database
    now_ms = args.now_ms or int(time.time() * 1000)
    hour_to = args.data_to_ms + 60_000
    selected = selection(client)
    runs = {
        "1h": (hour_to - 3_600_000, hour_to, {}),
        "24h": (now_ms - 86_400_000, now_ms, {}),
        "24h-selected": (now_ms - 86_400_000, now_ms, selected),
    }
    specs = {(d.uid, p.title): p for d in dashboard_specs(repo_settings()) for p in d.panels}
    reference = Reference(client)
    replays = ReplayReference(client)
    report: dict[str, Any] = {
        "runs": {},
        "selected": {k: [unhex_value(x) if k in HEX_VARIABLES else x for x in v.values] for k, v in selected.items()},
    }
    for run, (from_ms, to_ms, chosen) in runs.items():
        out: dict[str, Any] = {}
        for path in sorted((REPO / "dashboards").glob("*.json")):
            model = json.loads(path.read_text(encoding="utf-8"))
            variables = {v["name"]: chosen.get(v["name"], _default(v)) for v in model["templating"]["list"]}
            for suffix, raw_sql, panel in queries(model):
                interval = panel_interval_ms(
                    from_ms, to_ms, (panel or {}).get("maxDataPoints", 500), (panel or {}).get("interval")
                )
                ctx = QueryContext(from_ms, to_ms, interval)
                entry: dict[str, Any] = {"interval_ms": interval}
                started = time.perf_counter()
                try:
                    sql = expand_query(raw_sql, ctx, variables)
                    columns, rows = run_query(client, sql)
                    entry |= {"columns": columns, "rows": len(rows), "sample": _plain(rows[:3])}
                    spec = specs.get((model["uid"], panel["title"])) if panel else None
                    if spec is not None:
                        entry["spec_columns"] = list(spec.columns)
                        entry["format"] = spec.fmt
                        entry["expected_rows"] = int(
                            client.query(expand_query(spec.expect_sql, ctx, variables)).result_rows[0][0]
                        )
                        if spec.check is not None:
                            uses_stage = "$stage" in raw_sql or "${stage" in raw_sql
                            ref = reference.groups(spec.check, ctx, variables, uses_stage)
                            entry["percentiles"] = compare(spec.check, [c for c, _ in columns], rows, ref)
                        if spec.whatif is not None:
                            names = [c for c, _ in columns]
                            entry["whatif"] = replays.compare(spec.whatif, ctx, variables, names, rows)
                except Exception as exc:  # reported per panel: one broken panel must not hide the others
                    entry["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                entry["seconds"] = round(time.perf_counter() - started, 3)
                out[f"{path.stem}/{suffix}"] = entry
        report["runs"][run] = out
    report["alert_rules"] = check_alert_rules(client, hour_to)
    print(json.dumps(report, ensure_ascii=False, default=str))


if __name__ == "__main__":
    main()
    exit_process(0)
