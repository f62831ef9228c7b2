"""The project's design document (docs/design.md) is the one the code cites, and it names what the code has."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from schemas.dead_letter import DEAD_LETTER_REASONS
from streams.rules.model import ALERT_NAMES

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = out.split()
    except (OSError, subprocess.CalledProcessError):  # an unpacked sdist: no git
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    suffixes = {".py", ".md", ".sql", ".json", ".yaml", ".yml", ".toml", ".txt", ".sh"}
    return [ROOT / n for n in names if Path(n).suffix in suffixes and (ROOT / n).is_file()]


def test_nothing_cites_a_design_file_the_repository_does_not_have() -> None:
    assert DESIGN.is_file()
    pattern = "DESIGN" + ".md"  # split, so this file does not cite it
    # Applied migrations are immutable (their checksums are recorded in schema_migrations): two old ones keep
    # the old citation in a comment.
    citing = [
        str(p.relative_to(ROOT))
        for p in _tracked_text_files()
        if pattern in p.read_text("utf-8", "replace") and "migrations" not in p.parts
    ]
    assert citing == [], f"{pattern} is not in the repository; cite docs/design.md: {citing}"


def test_every_quoted_section_a_citation_names_is_a_heading_of_the_design_doc() -> None:
    headings = {
        line.lstrip("#").strip().lower() for line in DESIGN.read_text("utf-8").splitlines() if line.startswith("#")
    }
    cited = re.compile(r'docs/design\.md,?\s+"([^"]+)"')
    missing = []
    for path in _tracked_text_files():
        for section in cited.findall(path.read_text("utf-8", "replace")):
            if section.lower() not in headings:
                missing.append(f"{path.relative_to(ROOT)}: {section!r}")
    assert missing == [], f"cited sections that docs/design.md has no heading for: {missing}"


def test_the_design_doc_names_every_dead_letter_reason_and_alert() -> None:
    text = DESIGN.read_text("utf-8")
    assert [r for r in DEAD_LETTER_REASONS if f"`{r}`" not in text] == []
    assert [a for a in ALERT_NAMES if f"`{a}`" not in text] == []


def test_the_license_file_is_the_license_the_packages_declare() -> None:
    for project in (ROOT, ROOT / "emitter"):
        meta = tomllib.loads((project / "pyproject.toml").read_text("utf-8"))["project"]
        declared = meta["license"]["text"] if isinstance(meta["license"], dict) else meta["license"]
        assert declared == "Apache-2.0"
        text = (project / "LICENSE").read_text("utf-8")
        assert "Apache License" in text and "Version 2.0, January 2004" in text
