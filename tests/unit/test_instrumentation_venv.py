"""The instrumentation venv's place: one per requirements file content (tests/support/instrumentation_venv.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.instrumentation_venv import REQUIREMENTS, venv_dir


def test_the_venv_is_keyed_by_the_requirements(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("openai==1\n")
    b.write_text("openai==2\n")
    assert venv_dir(a, tmp_path) != venv_dir(b, tmp_path)
    assert venv_dir(a, tmp_path) == venv_dir(a, tmp_path) and venv_dir(a, tmp_path).parent == tmp_path
    assert REQUIREMENTS.is_file() and "openai==" in REQUIREMENTS.read_text()
