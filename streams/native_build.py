"""Compile the join's core with mypyc into ``.cache/native/`` (``python -m streams.native_build``; ``make setup``).

mypyc (part of mypy, already the project's type checker) turns the typed modules of
:data:`streams.core.native.NATIVE_SOURCES` into one C extension. The build runs out of the source tree
(setuptools' ``build_ext`` into ``.cache/native``), so the ``.py`` files stay what the repository holds
and :mod:`streams.core.native` decides per process whether the binary still matches them.

A failed build is not fatal: the manifest records the compiler's last words, the pipeline runs the Python
source and says so at start (``ttft_join_core_info``), and ``tests/unit/test_native_core.py`` fails, so a
machine that cannot compile is noticed rather than benchmarked silently slower.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from streams.core.native import MANIFEST, NATIVE_ROOT, NATIVE_SOURCES, REPO, check_manifest, source_digests

#: The shared library's name (``streams/core/native__mypyc.*.so``), fixed so rebuilds replace it.
GROUP_NAME = "streams.core.native"

# setuptools first: on Python >= 3.12 (no distutils) its shim provides the distutils mypyc's build imports.
_SETUP = """
from setuptools import setup
from mypyc.build import mypycify

setup(
    name="ttft-native-core",
    ext_modules=mypycify({sources!r}, opt_level="3", group_name={group!r}, target_dir={target!r}),
    script_args=["build_ext", "--build-lib", {lib!r}, "--build-temp", {temp!r}],
)
"""


def build(root: Path = REPO, out: Path = NATIVE_ROOT) -> dict[str, object]:
    """Compile into a fresh ``out`` and write its manifest; returns the manifest."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    work = out / "work"
    script = _SETUP.format(
        sources=list(NATIVE_SOURCES),
        group=GROUP_NAME,
        target=str(work / "c"),
        lib=str(out),
        temp=str(work / "obj"),
    )
    # The digests of what the compiler reads, taken before it reads: a module edited during the ~30 s build
    # then makes the binary stale instead of being recorded as compiled.
    sources = source_digests(root)
    started = time.monotonic()
    # The subprocess runs in the repository root: mypyc names modules by their path from there.
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPY_FORCE_COLOR": "0"},
    )
    manifest: dict[str, object] = {
        "built": proc.returncode == 0,
        "cache_tag": sys.implementation.cache_tag,
        "sources": sources,
        "seconds": round(time.monotonic() - started, 1),
    }
    if proc.returncode != 0:
        manifest["error"] = (proc.stderr or proc.stdout).strip()[-2000:]
    shutil.rmtree(work, ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streams.native_build", description=__doc__)
    p.add_argument("--if-stale", action="store_true", help="do nothing when the build matches the sources")
    args = p.parse_args(argv)
    if args.if_stale and check_manifest() is None:
        print(f"native core: current ({MANIFEST.relative_to(REPO)})")
        return 0
    manifest = build()
    if manifest["built"]:
        print(f"native core: compiled {len(NATIVE_SOURCES)} modules with mypyc in {manifest['seconds']} s")
    else:
        print(f"native core: the mypyc build FAILED; the join runs the Python source.\n{manifest['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
