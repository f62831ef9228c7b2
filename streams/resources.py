"""The data files ``ttft`` reads at run time: ClickHouse migrations, Grafana dashboards, the default config.

The repository keeps each in one place, its single source of truth: ``deploy/clickhouse/migrations``,
``dashboards/`` and ``deploy/config``. A wheel carries copies of them inside this package,
``streams/_shipped/<name>/``, made by the build (``setup.py`` copies :data:`SHIPPED` while building, so
nothing is duplicated in the repository and nothing can drift: the wheel test compares the wheel's files
with these folders). An installed wheel reads its copies; a checkout (an editable install) reads the
repository's folders.

This module imports nothing but the standard library: ``setup.py`` loads it by path to know what to copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

#: name -> (folder in the repository, file pattern): what a wheel ships in ``streams/_shipped/<name>``.
SHIPPED: Final[dict[str, tuple[str, str]]] = {
    "migrations": ("deploy/clickhouse/migrations", "*.sql"),
    "dashboards": ("dashboards", "*.json"),
    "config": ("deploy/config", "*.yaml"),
}
#: Where a wheel's copies are, relative to the package root.
SHIPPED_DIR: Final = "_shipped"

_PACKAGE: Final = Path(__file__).resolve().parent
_REPO: Final = _PACKAGE.parent


def resource_dir(name: str) -> Path:
    """The folder of the ``name`` resources: the wheel's copy if this is an installed wheel, else the
    repository's. Raises ``FileNotFoundError`` when neither exists (a broken install)."""
    shipped = _PACKAGE / SHIPPED_DIR / name
    if shipped.is_dir():
        return shipped
    source = _REPO / SHIPPED[name][0]
    if source.is_dir():
        return source
    raise FileNotFoundError(
        f"{name} not found: neither {shipped} (an installed wheel) nor {source} (a checkout) exists; "
        "reinstall ttft-pipeline"
    )


def checkout_dir(relative: str) -> Path | None:
    """A folder of the repository when running from a checkout (an editable install), else ``None``."""
    path = _REPO / relative
    return path if (_REPO / "pyproject.toml").is_file() and path.is_dir() else None


def migrations_dir() -> Path:
    """The numbered ClickHouse migration files (``NNNN_name.sql``)."""
    return resource_dir("migrations")


def dashboards_dir() -> Path:
    """The Grafana dashboards (``ttft-*.json``) generated from the default config."""
    return resource_dir("dashboards")


def default_config_file() -> Path:
    """The annotated default ``TTFT_CONFIG`` (``ttft.yaml``); equal to the built-in defaults."""
    return resource_dir("config") / "ttft.yaml"
