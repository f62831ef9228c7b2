"""Render the links of the committed dashboards as Grafana would, and check where each one leads.

A data link's URL is filled from one table row (``${__value.raw}``, ``${__data.fields.<column>}``), the source
board's variables (``${name:queryparam}``) and the time range (``${__url_time_range}``); a board link keeps
the time and the variables. :func:`check_link` then checks the target: an existing board uid and slug, only
variables that board has, tenant and version values that are the hex of an id (what the variables hold:
``streams.grafana.sql.hex_variable_sql``), a request id that decodes to the row's, or the trace URL template
with the row's trace id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from streams.settings import Settings

FROM_MS, TO_MS = 1_700_000_000_000, 1_700_003_600_000
HEX_VARIABLES = ("tenant", "version")
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::([a-z]+))?\}")


@dataclass(frozen=True)
class Link:
    """One link: its board and panel, the column whose cells carry it (None: a board link), its URL."""

    board: str
    panel: str | None
    column: str | None
    title: str
    url: str
    keep_time: bool = False
    include_vars: bool = False


def load_boards(directory: Path) -> dict[str, dict[str, Any]]:
    """``{uid: model}`` of the dashboards in ``directory``."""
    models = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))]
    return {m["uid"]: m for m in models}


def board_slugs(directory: Path) -> dict[str, str]:
    """``{uid: slug}``: a board's slug is its file's name."""
    return {json.loads(p.read_text(encoding="utf-8"))["uid"]: p.stem for p in sorted(directory.glob("*.json"))}


def links(boards: Mapping[str, Mapping[str, Any]]) -> Iterator[Link]:
    """Every link of every board: header links and each table column's data links."""
    for uid, model in boards.items():
        for link in model.get("links", []):
            yield Link(uid, None, None, link["title"], link["url"], link["keepTime"], link["includeVars"])
        for panel in model["panels"]:
            field_config = panel.get("fieldConfig", {})
            for link in field_config.get("defaults", {}).get("links", []):
                yield Link(uid, panel["title"], None, link["title"], link["url"])
            for override in field_config.get("overrides", []):
                for prop in override["properties"]:
                    if prop["id"] == "links":
                        column = override["matcher"]["options"]
                        for link in prop["value"]:
                            yield Link(uid, panel["title"], column, link["title"], link["url"])


def variable_names(model: Mapping[str, Any]) -> set[str]:
    return {v["name"] for v in model["templating"]["list"]}


def hex_id(text: str) -> str:
    """What ``$tenant``/``$version`` hold for an id (ClickHouse ``hex()``: upper case)."""
    return text.encode("utf-8").hex().upper()


def render(
    link: Link,
    row: Mapping[str, Any],
    selection: Mapping[str, Sequence[str]],
    source_variables: set[str],
) -> str:
    """The URL Grafana opens for ``link`` clicked on ``row`` (values as the panel returns them), with the
    source board's variables at ``selection`` (hex values for tenant and version)."""

    def sub(match: re.Match[str]) -> str:
        name, fmt = match.group(1), match.group(2)
        if name == "__value.raw":
            assert link.column is not None, link
            value = str(row[link.column])
        elif name.startswith("__data.fields."):
            column = name.removeprefix("__data.fields.")
            assert column in row, f"{link}: the row has no column {column!r}"
            value = str(row[column])
        elif name == "__url_time_range":
            return f"from={FROM_MS}&to={TO_MS}"
        else:
            assert name in source_variables, f"{link}: board {link.board} has no variable {name!r}"
            assert fmt == "queryparam", link
            return "&".join(f"var-{name}={quote(v, safe='')}" for v in selection.get(name, ["$__all"]))
        if fmt == "percentencode":
            return quote(value, safe="")
        assert fmt is None, link
        return value

    url = _TEMPLATE.sub(sub, link.url)
    if link.keep_time or link.include_vars:
        params = [f"from={FROM_MS}&to={TO_MS}"] if link.keep_time else []
        if link.include_vars:
            params += [
                f"var-{name}={quote(v, safe='')}" for name in sorted(source_variables) for v in selection.get(name, [])
            ]
        url += ("&" if "?" in url else "?") + "&".join(params) if params else ""
    assert "${" not in url and "$__" not in url.replace("%24__all", ""), url
    return url


def check_link(
    url: str,
    boards: Mapping[str, Mapping[str, Any]],
    slugs: Mapping[str, str],
    settings: Settings,
    *,
    row: Mapping[str, Any],
    known_ids: set[str],
    stages: set[str],
    header: bool = False,
) -> str:
    """Check the target of a rendered link; returns the uid of the board it opens, or ``"trace"``. A header
    link (``include_vars``) passes all the source board's variables: the target ignores those it lacks."""
    template = settings.dashboards.trace_url
    if "trace_id" in row and url == template.replace("{trace_id}", quote(str(row["trace_id"]), safe="")):
        return "trace"
    parts = urlsplit(url)
    assert not parts.scheme and not parts.netloc, f"a board link is a path in the same Grafana: {url}"
    match = re.fullmatch(r"/d/([^/]+)/([^/]+)", parts.path)
    assert match, url
    uid, slug = match.groups()
    assert uid in boards, f"no board {uid!r}: {url}"
    assert slug == slugs[uid], f"{url}: board {uid} is /d/{uid}/{slugs[uid]}"
    query = parse_qs(parts.query, keep_blank_values=True)
    targets = variable_names(boards[uid])
    for key, values in query.items():
        if key in ("from", "to"):
            assert all(v.isdigit() for v in values), url
            continue
        assert key.startswith("var-"), url
        name = key[4:]
        if name not in targets:
            assert header, f"{url}: board {uid} has no variable {name}"
            continue
        for value in values:
            if value == "$__all":
                continue
            if name in HEX_VARIABLES:
                assert re.fullmatch(r"(?:[0-9A-F]{2})+", value), f"{url}: {name}={value!r} is not the hex of an id"
                assert bytes.fromhex(value).decode("utf-8") in known_ids, f"{url}: unknown {name} {value}"
            elif name == "stage":
                assert value in stages, url
            elif name == "request_id":
                assert value in known_ids, url
    assert "from" in query and "to" in query, f"{url} does not carry the time range"
    return uid


def check_report_links(report: Mapping[str, Any], directory: Path, settings: Settings, slugify: Any) -> int:
    """Render every data link of every board from the rows ``tests/support/panel_check.py`` reported (the 24 h
    run's samples: the store's real ids) and check each target; returns how many links were checked. Each
    tenant or version a link passes must be the row's own."""
    boards, slugs = load_boards(directory), board_slugs(directory)
    stages = {"retrieval", "vector_recall", "bm25_recall", "rerank", "prompt_assemble", "llm_ttft", "other", "ttft"}
    checked = 0
    for link in links(boards):
        if link.panel is None:
            continue
        entry = report["runs"]["24h"][f"{slugs[link.board]}/{slugify(link.panel)}"]
        names = [name for name, _ in entry["columns"]]
        for sample in entry["sample"]:
            row = dict(zip(names, sample, strict=True))
            if link.column is not None and row.get(link.column) is None:
                continue  # Grafana renders no link on an empty cell
            known = {str(row[c]) for c in ("tenant_id", "version_id", "canary_version", "request_id") if c in row}
            url = render(link, row, {}, variable_names(boards[link.board]))
            row_stages = {str(row[c]) for c in ("stage", "biggest_p95_stage", "tail_dominant_stage") if c in row}
            check_link(url, boards, slugs, settings, row=row, known_ids=known, stages=stages | row_stages)
            checked += 1
    return checked
