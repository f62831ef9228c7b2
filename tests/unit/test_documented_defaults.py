"""The defaults the README's configuration table states are the code's, and the shipped config's.

Issue 29 found ``windows.grace_s`` documented as 40 while the code said 10. This test reads every row of
the README's settings table whose default it can compare, resolves each name to its field of
:class:`streams.settings.Settings` (``TTFT_X__Y`` or ``x.y``), and checks the stated default against the
field's default and, where the shipped ``deploy/config/ttft.yaml`` sets it, that value too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHIPPED = ROOT / "deploy" / "config" / "ttft.yaml"

#: Rows whose default is not one field's constant: computed from another setting, read outside Settings, or
#: a prose pointer. Each is named here so a new row is checked unless someone says why not.
NOT_COMPARABLE = {
    "TTFT_HOME",  # documented as the directory the relative default resolves to
    "TTFT_CLICKHOUSE_URL",  # derived from TTFT_HOME
    "TTFT_CONFIG",  # the file itself
    "TTFT_NATIVE",  # read by streams/core/native.py before settings exist
    "rules.*",
    "tenants.<t>.slo_ms",
}


def _settings_rows() -> list[tuple[list[str], list[str]]]:
    """(names, defaults) of each row of the table under "## Configuration"."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = _expand(re.findall(r"`([^`]+)`", cells[0]))
        defaults = [d.strip().strip("`") for d in cells[1].split(" / ")]
        rows.append((names, defaults))
    return rows


def _expand(names: list[str]) -> list[str]:
    """``TTFT_STORE__HTTP_PORT`` / ``_HOST`` -> the second is ``TTFT_STORE__HTTP_HOST``."""
    out: list[str] = []
    for name in names:
        if name.startswith("_") and out:
            first = out[0]
            out.append(first[: first.rindex("_")] + name)
        else:
            out.append(name)
    return out


def _path(name: str) -> list[str]:
    if name.startswith("TTFT_"):
        return name[len("TTFT_") :].lower().split("__")
    return name.split(".")


def _code_default(path: list[str]) -> Any:
    model: Any = Settings
    value: Any = None
    for part in path:
        field = model.model_fields[part]  # KeyError: the README names a setting that does not exist
        value = field.get_default(call_default_factory=True)
        section = field.annotation
        model = section if isinstance(section, type) and issubclass(section, BaseModel) else None
    return value


def _shipped(path: list[str]) -> Any:
    node: Any = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "–"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    if hasattr(value, "get_secret_value"):
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_documented_default_is_the_codes_and_the_shipped_configs() -> None:
    rows = _settings_rows()
    checked = 0
    wrong = []
    for names, defaults in rows:
        if len(names) != len(defaults):
            defaults = defaults * len(names) if len(defaults) == 1 else defaults
        assert len(names) == len(defaults), f"README row {names}: {len(defaults)} defaults for {len(names)} names"
        for name, documented in zip(names, defaults, strict=True):
            if name in NOT_COMPARABLE:
                continue
            path = _path(name)
            code = _render(_code_default(path))
            if documented != code:
                wrong.append(f"{name}: README says {documented!r}, the code's default is {code!r}")
            shipped = _shipped(path)
            if shipped is not None and _render(shipped) != documented:
                wrong.append(f"{name}: README says {documented!r}, deploy/config/ttft.yaml sets {shipped!r}")
            checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked >= 30, f"only {checked} defaults compared: did the README's table change shape?"
