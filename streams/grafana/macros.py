"""The query path of the ``grafana-clickhouse-datasource`` plugin, reproduced exactly for tests.

A panel's ``rawSql`` reaches ClickHouse after three rewrites, in this order:

1. frontend ``$__conditionalAll(cond, $var)`` (``CHDatasource.applyConditionalAll``): ``1=1`` when the
   variable's current value is ``''`` or ``$__all``, else ``cond`` verbatim; innermost-last, by
   ``lastIndexOf``;
2. frontend template variables (Grafana ``templateSrv.replace`` with the plugin's formatter):
   ``${var:singlequote}`` -> ``'a','b'`` (quotes escaped as ``\\'``), ``${var:percentencode}`` ->
   ``%7Ba%2Cb%7D`` (``encodeURIComponent`` that also escapes ``!'()*``), bare ``$var`` / ``${var}`` ->
   ``'a','b'`` for a multi-value selection (no escaping) or the value itself;
3. backend macros (plugin ``pkg/macros/macros.go`` on top of ``sqlutil.Interpolate`` of the plugin SDK):
   see :data:`MACROS`. The SDK finds a macro by ``\\$__name\\b`` and then scans forward for the first
   balanced parenthesis group, *even past the macro name*, unless a ``)`` comes first: an argument-less
   macro (``$__fromTime``, ``$__interval_s``) must therefore be followed by ``)`` before any ``(``, or the
   SDK swallows the text up to the next call. Arguments are split on every ``,`` (no nesting).

The interval is Grafana's: ``max(roundInterval((to - from) / maxDataPoints), panel min interval)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final
from urllib.parse import quote


class MacroError(ValueError):
    """A macro call the plugin would reject (wrong argument count)."""


@dataclass(frozen=True, slots=True)
class QueryContext:
    """What the backend knows about one query: the time range (epoch ms) and the interval (ms)."""

    from_ms: int
    to_ms: int
    interval_ms: int


@dataclass(frozen=True, slots=True)
class Variable:
    """A dashboard variable's current state: ``selected`` values, or ``None`` for *All* (= ``options``)."""

    name: str
    options: tuple[str, ...]
    selected: tuple[str, ...] | None = None

    @property
    def is_all(self) -> bool:
        return self.selected is None

    @property
    def values(self) -> tuple[str, ...]:
        return self.options if self.selected is None else self.selected


# --- Grafana's interval --------------------------------------------------------------------------

_ROUND_STEPS: Final = (
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1_500, 1_000),
    (3_500, 2_000),
    (7_500, 5_000),
    (12_500, 10_000),
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000, 2_592_000_000),
)
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_MS: Final = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def round_interval(interval_ms: float) -> int:
    """Grafana's ``rangeutil.roundInterval``."""
    for limit, value in _ROUND_STEPS:
        if interval_ms < limit:
            return value
    return 31_536_000_000


def duration_ms(text: str) -> int:
    """``"1m"`` -> 60000 (Grafana interval strings; a leading ``>`` is ignored)."""
    match = _DURATION.fullmatch(text.lstrip(">").strip())
    if match is None:
        raise ValueError(f"not a Grafana duration: {text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def panel_interval_ms(from_ms: int, to_ms: int, max_data_points: int, min_interval: str | None) -> int:
    """The ``intervalMs`` Grafana sends for a panel (``calculateInterval`` with the panel's min interval)."""
    interval = round_interval((to_ms - from_ms) / max_data_points)
    low = duration_ms(min_interval) if min_interval else 1
    return max(interval, low)


# --- frontend: conditionalAll and template variables ----------------------------------------------

_CONDITIONAL_ALL: Final = "$__conditionalAll("
_VAR_IN_ARG = re.compile(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+")
_TEMPLATE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")


def _macro_args(text: str, open_index: int) -> list[str]:
    """``CHDatasource.getMacroArgs``: top-level comma-separated arguments of the call at ``open_index``."""
    args: list[str] = []
    depth = 0
    last = 1
    sub = text[open_index:]
    for match in re.finditer(r"[(),]", sub):
        token = match.group(0)
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        if token == "," and depth == 1:
            args.append(sub[last : match.end() - 1])
            last = match.end()
        if depth == 0:
            args.append(sub[last : match.end() - 1])
            return args
    return []


def apply_conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    """Step 1: the frontend ``$__conditionalAll`` rewrite."""
    index = sql.rfind(_CONDITIONAL_ALL)
    while index != -1:
        params = _macro_args(sql, index + len(_CONDITIONAL_ALL) - 1)
        if len(params) != 2:
            return sql
        phrase = params[0]
        found = _VAR_IN_ARG.search(params[1].strip())
        if found:
            variable = variables.get(found.group(0))
            if variable is not None and (variable.is_all or ",".join(variable.values) == ""):
                phrase = "1=1"
        sql = sql.replace(f"{_CONDITIONAL_ALL}{params[0]},{params[1]})", phrase, 1)
        index = sql.rfind(_CONDITIONAL_ALL)
    return sql


def _format(values: Sequence[str], fmt: str | None, multi: bool) -> str:
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
    if fmt == "raw":
        return ",".join(values)
    if fmt == "percentencode":
        # Grafana's encodeURIComponentStrict over "{a,b}" for an array value, else over the value.
        return quote("{" + ",".join(values) + "}" if multi else values[0], safe="")
    if fmt is not None:
        raise ValueError(f"variable format {fmt!r} is not reproduced here")
    # The plugin's own formatter for bare $var: a multi-value selection becomes 'a','b' (no escaping).
    return "'" + "','".join(values) + "'" if multi else values[0]


def interpolate_variables(sql: str, variables: Mapping[str, Variable]) -> str:
    """Step 2: Grafana ``templateSrv.replace`` for the variables given (unknown names stay as they are)."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(4)
        fmt = match.group(3) or match.group(6)
        variable = variables.get(name)
        if variable is None:
            return match.group(0)
        multi = variable.is_all or len(variable.values) != 1
        return _format(variable.values, fmt, multi)

    return _TEMPLATE.sub(sub, sql)


# --- backend: the plugin's macros on sqlutil.Interpolate -----------------------------------------


def _seconds(ms: int) -> int:
    return ms // 1000  # Go's time.Unix(): floor for times after 1970


def _datetime(ms: int) -> str:
    return f"toDateTime({_seconds(ms)})"


def _datetime64(ms: int) -> str:
    return f"fromUnixTimestamp64Milli({ms})"


def _date(ms: int) -> str:
    return "toDate('" + datetime.fromtimestamp(_seconds(ms), UTC).strftime("%Y-%m-%d") + "')"


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(_seconds(ms), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _args(n: int, args: list[str]) -> list[str]:
    if len(args) != n:
        raise MacroError(f"unexpected number of arguments: expected {n}, received {len(args)}")
    return args


MacroFn = Callable[[QueryContext, list[str]], str]


def _time_filter(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"{col} >= {_datetime(q.from_ms)} AND {col} <= {_datetime(q.to_ms)}"


def _time_filter_ms(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"{col} >= {_datetime64(q.from_ms)} AND {col} <= {_datetime64(q.to_ms)}"


def _date_filter(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"{col} >= {_date(q.from_ms)} AND {col} <= {_date(q.to_ms)}"


def _date_time_filter(q: QueryContext, a: list[str]) -> str:
    d, t = _args(2, a)
    return (
        f"({d} >= {_date(q.from_ms)} AND {d} <= {_date(q.to_ms)}) AND "
        f"({t} >= {_datetime(q.from_ms)} AND {t} <= {_datetime(q.to_ms)})"
    )


def _time_interval(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"toStartOfInterval(toDateTime({col}), INTERVAL {max(q.interval_ms // 1000, 1)} second)"


def _time_interval_ms(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"toStartOfInterval(toDateTime64({col}, 3), INTERVAL {max(q.interval_ms, 1)} millisecond)"


def _time_from(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"{col} >= '{_rfc3339(q.from_ms)}'"


def _time_to(q: QueryContext, a: list[str]) -> str:
    (col,) = _args(1, a)
    return f"{col} <= '{_rfc3339(q.to_ms)}'"


#: Macro name -> expansion: the plugin's map, plus the SDK defaults it does not override.
MACROS: Final[dict[str, MacroFn]] = {
    "fromTime": lambda q, a: _datetime(q.from_ms),
    "toTime": lambda q, a: _datetime(q.to_ms),
    "fromTime_ms": lambda q, a: _datetime64(q.from_ms),
    "toTime_ms": lambda q, a: _datetime64(q.to_ms),
    "timeFilter": _time_filter,
    "timeFilter_ms": _time_filter_ms,
    "dateFilter": _date_filter,
    "dateTimeFilter": _date_time_filter,
    "dt": _date_time_filter,
    "timeInterval": _time_interval,
    "timeInterval_ms": _time_interval_ms,
    "interval_s": lambda q, a: str(max(q.interval_ms // 1000, 1)),
    "timeFrom": _time_from,
    "timeTo": _time_to,
    "table": lambda q, a: "",
    "column": lambda q, a: "",
}


def macro_matches(sql: str, name: str) -> list[tuple[str, str]]:
    """``sqlutil.getMacroMatches``: (matched text, argument text) for every use of ``name``."""
    out: list[tuple[str, str]] = []
    for found in re.finditer(rf"\$__{re.escape(name)}\b", sql, flags=re.ASCII):
        start = found.start()
        tail = sql[start:]
        depth = 0
        end = 0
        arg_start = 0
        for idx, char in enumerate(tail):
            if depth == 0 and end > 0:
                break
            if char == "(":
                depth += 1
                if arg_start == 0:
                    arg_start = idx + 1
            elif char == ")":
                if depth == 0:
                    end = 0
                    break
                depth -= 1
                end = idx + 1
        if end == 0:
            out.append((sql[start : found.end()], ""))
        else:
            out.append((tail[:end], tail[arg_start : end - 1] if arg_start > 0 else ""))
    return out


def expand_macros(sql: str, query: QueryContext, order: Sequence[str] | None = None) -> str:
    """Step 3: the backend macros. ``order`` fixes the macro order (Go iterates a map: random order)."""
    for name in order or MACROS:
        for text, arg_text in macro_matches(sql, name):
            args = [a.strip() for a in arg_text.split(",")]
            sql = sql.replace(text, MACROS[name](query, args))
    return sql


def expand_query(sql: str, query: QueryContext, variables: Mapping[str, Variable] | None = None) -> str:
    """The SQL ClickHouse receives for a panel's ``rawSql``: steps 1, 2 and 3."""
    variables = variables or {}
    return expand_macros(interpolate_variables(apply_conditional_all(sql, variables), variables), query)
