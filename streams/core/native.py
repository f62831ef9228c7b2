"""Which build of the join's core this process runs: the mypyc-compiled one, or the Python source.

The join folds every stage event through :mod:`streams.core.join`, :mod:`~streams.core.join_state`,
:mod:`~streams.core.join_record` and the dead-letter guard (:mod:`~streams.core.guard`). ``make setup``
compiles exactly these modules (:data:`NATIVE_SOURCES`) with mypyc
(:mod:`streams.native_build`) into ``.cache/native/``, which is about 1.5x less CPU per event (issue 13).
The source stays the truth: the compiled modules are used only while the manifest written next to them
records the SHA-256 of the very source files in the tree, so an edited module runs as Python until the
next ``make`` rebuilds it, never as a stale binary.

:func:`activate` runs once, from ``streams/core/__init__.py``, before any of them is imported: it puts
the compiled package directory first on ``streams.core.__path__``. ``TTFT_NATIVE=0`` keeps the pure
source (the tests compare both). :data:`STATUS` says which one runs and why; the join logs it at start
and exports it as ``ttft_join_core_info``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Final

#: The modules compiled, relative to the repository root (the order of the manifest).
NATIVE_SOURCES: Final = (
    "streams/core/join.py",
    "streams/core/join_state.py",
    "streams/core/join_record.py",
    "streams/core/guard.py",
)
REPO: Final = Path(__file__).resolve().parents[2]
#: Where the build lives: ``.cache/native``, or ``TTFT_NATIVE_ROOT`` (the fast tier on another Python keeps
#: its own build there, ``deploy/python/fast-tier.sh``).
NATIVE_ROOT: Final = Path(os.environ.get("TTFT_NATIVE_ROOT") or REPO / ".cache" / "native")
MANIFEST: Final = NATIVE_ROOT / "manifest.json"
#: ``native``, or ``python (<why>)``: set by :func:`activate`.
STATUS = "python (not activated)"


def source_digests(root: Path = REPO) -> dict[str, str]:
    """SHA-256 of each compiled module's source, as the manifest records them."""
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in NATIVE_SOURCES}


def check_manifest(manifest: Path = MANIFEST, root: Path = REPO) -> str | None:
    """None when the compiled modules match this tree and this interpreter, else why not."""
    try:
        built = json.loads(manifest.read_text())
    except FileNotFoundError:
        return "not built: run make setup"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest {manifest}: {exc}"
    if not built.get("built"):
        return f"the build failed: {built.get('error', 'no reason recorded')}"
    if built.get("cache_tag") != sys.implementation.cache_tag:
        return f"built for {built.get('cache_tag')}, this is {sys.implementation.cache_tag}"
    if built.get("sources") != source_digests(root):
        return "stale: the source changed since the build (make setup rebuilds it)"
    return None


def activate(package_path: list[str]) -> str:
    """Put the compiled modules first on ``package_path`` (``streams.core.__path__``) when they are current."""
    global STATUS
    if os.environ.get("TTFT_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        STATUS = "python (TTFT_NATIVE=0)"
        return STATUS
    problem = check_manifest()
    if problem is not None:
        STATUS = f"python ({problem})"
        return STATUS
    compiled = str(NATIVE_ROOT / "streams" / "core")
    if compiled not in package_path:
        package_path.insert(0, compiled)
    STATUS = "native"
    return STATUS
