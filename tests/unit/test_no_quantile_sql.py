"""Percentiles come from the project's sketch bins only, and are never averaged or summed.

Scans the SQL the project ships: ``.sql`` files and dashboard / alert-rule JSON and YAML under
``deploy/``, ``dashboards/`` and ``streams/``, plus the string literals (not docstrings) of ``streams/``
Python modules. docs/ is not scanned: it is where this rule is explained.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.store.sketch_sql import quantile_sql, rollup_sql, udf_statement

ROOT = Path(__file__).resolve().parents[2]
SQL_SUFFIXES = {".sql", ".json", ".yaml", ".yml"}
# ClickHouse's own quantile family (quantile, quantiles, quantileExact, quantileDD, quantilesTDigest, ...)
# and its median aliases; ClickHouse names are case-sensitive, so ttftSketchQuantile( does not match.
FORBIDDEN_FUNCTION = re.compile(r"(?<![\w.])(?:quantiles?(?:[A-Z]\w*)?|median(?:[A-Z]\w*)?)\s*\(")
# Averaging or summing stored percentile columns: avg(p95), avgIf(s.p99, ...), sum(ttft_p95), median(p50).
AVERAGED_PERCENTILE = re.compile(r"(?i)(?<![\w.])(?:avg|sum|median|mean)\w*\s*\(\s*(?:\w+\.)?\w*p\d{2}\b")


def violations(text: str) -> list[str]:
    return [m.group(0) for pattern in (FORBIDDEN_FUNCTION, AVERAGED_PERCENTILE) for m in pattern.finditer(text)]


def _python_sql_strings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


def shipped_sql() -> Iterator[tuple[Path, str]]:
    for folder in ("deploy", "dashboards", "streams"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SQL_SUFFIXES and path.is_file():
                yield path, path.read_text(encoding="utf-8", errors="replace")
            elif path.suffix == ".py" and path.is_file():
                for text in _python_sql_strings(path):
                    yield path, text


@pytest.mark.parametrize(
    "bad",
    [
        "SELECT quantile(0.95)(ttft_ms) FROM t",
        "SELECT quantileExact(0.95)(ttft_ms)",
        "quantilesDD(0.01, 0.5)(v)",
        "quantileTDigestMerge(0.9)(s)",
        "median(ttft_ms)",
        "SELECT avg(p95) FROM stage_windows",
        "avgIf(w.p99, stage = 'ttft')",
        "sum(ttft_p95)",
        "AVG( p50 )",
    ],
)
def test_patterns_catch_forbidden_sql(bad: str) -> None:
    assert violations(bad)


@pytest.mark.parametrize(
    "good",
    [
        "SELECT ttftSketchQuantile(sumMap(bins), sum(zero_count), 0.95, 0.01) AS p95",
        "SELECT max(p95), sum(count), sumMap(bins) FROM stage_windows FINAL",
        "quantile_from_bins(bins, zero_count, q)",
        quantile_sql("sumMap(bins)", "sum(zero_count)", 0.95),
        rollup_sql("ttft"),
        rollup_sql("ttft", use_udf=True),
    ],
)
def test_patterns_pass_the_project_quantile(good: str) -> None:
    assert violations(good) == []


def test_no_clickhouse_quantile_or_averaged_percentiles_in_shipped_sql() -> None:
    found = [f"{path.relative_to(ROOT)}: {v}" for path, text in shipped_sql() for v in violations(text)]
    assert found == []


def test_udf_migration_is_the_sql_twin() -> None:
    migration = (ROOT / "deploy/clickhouse/migrations/0004_functions.sql").read_text(encoding="utf-8")
    code = " ".join(line for line in migration.splitlines() if line.strip() and not line.startswith("--"))
    assert code.rstrip(";").strip() == udf_statement()
