"""Build hook of ttft-pipeline (everything else is in pyproject.toml).

A wheel ships the repository's data files inside the ``streams`` package: the ClickHouse migrations,
the Grafana dashboards and the default config (``streams.resources.SHIPPED``), copied into
``streams/_shipped/`` of the build while it is made. The repository keeps one copy of each, where it
always did; an editable install reads them there and gets no copy.
"""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def copy_shipped(root: Path, package_dir: Path) -> list[Path]:
    """Copy every ``SHIPPED`` resource from ``root`` into ``package_dir/_shipped``; returns the copies.

    A resource folder that is missing or empty is an error: a wheel without its migrations is broken.
    """
    resources = runpy.run_path(str(root / "streams" / "resources.py"))
    copies: list[Path] = []
    for name, (folder, pattern) in resources["SHIPPED"].items():
        sources = sorted((root / folder).glob(pattern))
        if not sources:
            raise FileNotFoundError(f"no {pattern} in {root / folder}: cannot ship {name}")
        target = package_dir / resources["SHIPPED_DIR"] / name
        target.mkdir(parents=True, exist_ok=True)
        for source in sources:
            copies.append(Path(shutil.copyfile(source, target / source.name)))
    return copies


class BuildPyWithShippedFiles(build_py):
    """``build_py`` plus the shipped resources (not for an editable install: it reads the checkout)."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            copy_shipped(ROOT, Path(self.build_lib) / "streams")


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithShippedFiles})
