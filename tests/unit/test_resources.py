"""The data files a wheel ships: setup.py's build step copies exactly streams.resources.SHIPPED, an installed
package reads its copies, a checkout reads the repository's folders (tests/integration/test_wheel.py builds
and installs a real wheel)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from streams import resources
from streams.store.migrate import load_migrations, migrations_dir

REPO = Path(__file__).resolve().parents[2]


def _copy_shipped() -> object:
    return runpy.run_path(str(REPO / "setup.py"), run_name="setup_under_test")["copy_shipped"]


def test_the_build_copies_every_shipped_folder_byte_for_byte(tmp_path: Path) -> None:
    copy_shipped = _copy_shipped()
    copies = copy_shipped(REPO, tmp_path / "streams")  # type: ignore[operator]
    shipped_root = tmp_path / "streams" / resources.SHIPPED_DIR
    expected = {
        f"{name}/{path.name}": path.read_bytes()
        for name, (folder, pattern) in resources.SHIPPED.items()
        for path in (REPO / folder).glob(pattern)
    }
    assert {p.relative_to(shipped_root).as_posix() for p in copies} == set(expected)
    for name, content in expected.items():
        assert (shipped_root / name).read_bytes() == content, name


def test_a_checkout_reads_the_repository_folders() -> None:
    assert resources.migrations_dir() == REPO / "deploy" / "clickhouse" / "migrations" == migrations_dir()
    assert resources.dashboards_dir() == REPO / "dashboards"
    assert resources.default_config_file() == REPO / "deploy" / "config" / "ttft.yaml"
    assert resources.checkout_dir("dashboards") == REPO / "dashboards"
    assert load_migrations()


def test_an_installed_package_reads_its_own_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site-packages" / "streams"
    copied = _copy_shipped()(REPO, package)  # type: ignore[operator]
    assert copied
    monkeypatch.setattr(resources, "_PACKAGE", package)
    monkeypatch.setattr(resources, "_REPO", package.parent)
    assert resources.migrations_dir() == package / "_shipped" / "migrations"
    assert [m.name for m in load_migrations()] == [
        m.name for m in load_migrations(REPO / "deploy/clickhouse/migrations")
    ]
    assert resources.default_config_file().read_bytes() == (REPO / "deploy/config/ttft.yaml").read_bytes()
    assert resources.checkout_dir("dashboards") is None  # no pyproject.toml beside an installed package


def test_a_missing_resource_says_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "_PACKAGE", tmp_path / "streams")
    monkeypatch.setattr(resources, "_REPO", tmp_path)
    with pytest.raises(FileNotFoundError, match="migrations not found"):
        resources.migrations_dir()


def test_the_build_refuses_to_ship_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "resources.py").write_bytes((REPO / "streams" / "resources.py").read_bytes())
    with pytest.raises(FileNotFoundError, match="cannot ship"):
        _copy_shipped()(tmp_path, tmp_path / "out")  # type: ignore[operator]


def test_the_sdist_manifest_carries_every_shipped_folder() -> None:
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8")
    for folder, pattern in resources.SHIPPED.values():
        assert f"graft {folder}" in manifest or f"include {folder}/{pattern}" in manifest, folder
