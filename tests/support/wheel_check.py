"""Build the wheels of this checkout and run ``ttft`` from them in a fresh venv outside the checkout.

    python tests/support/wheel_check.py [--keep]

1. a snapshot of the checkout (tracked and untracked files, not ignored ones, as a fresh clone plus the
   work in progress) in a temp dir;
2. ``python -m build`` of ttft-pipeline and of ttft-emit (``emitter/``): an sdist, then a wheel from it;
3. a fresh venv from this interpreter's base Python, and ``pip install`` of the pipeline's wheel with
   its dependencies at the versions of the running venv (``pip freeze`` as constraints) from a local
   wheelhouse, ``.cache/wheelhouse``, filled from the package index on first use;
4. from a directory outside the checkout, with ``TTFT_HOME`` in the temp dir (a fresh embedded store):
   ``ttft --version``, ``ttft db migrate`` (twice), ``ttft worker --help``, a store filled through the
   installed package's own pure core (``fill_store_pure.py``, copied out), ``ttft breakdown --json``.

Prints one JSON line last: each step's seconds and output, the wheel's shipped files. Exit status 1 on
any failure. tests/integration/test_wheel.py runs it and checks the details.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
FILL_STORE = REPO / "tests" / "support" / "fill_store_pure.py"


class StepFailed(RuntimeError):
    pass


class Steps:
    """Runs commands, timing each; a failure stops the check with the command's output."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.outputs: dict[str, str] = {}

    def run(self, name: str, command: list[str], **kwargs: Any) -> str:
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, **kwargs)
        self.seconds[name] = round(time.monotonic() - started, 1)
        shown = " ".join(command)
        print(f"$ {shown}  ({self.seconds[name]} s, exit {result.returncode})", flush=True)
        if result.returncode != 0:
            raise StepFailed(f"{name}: exit {result.returncode}\n$ {shown}\n{result.stdout}\n{result.stderr}")
        self.outputs[name] = result.stdout
        return str(result.stdout)


def snapshot(target: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the checkout, as they are now."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listing.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is not part of it
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def constraints(path: Path) -> Path:
    """The running venv's versions, so the fresh venv gets what the suite was tested with."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout
    path.write_text("".join(line + "\n" for line in frozen.splitlines() if "@" not in line and line.strip()))
    return path


def clean_env(home: Path) -> dict[str, str]:
    """The environment of the installed ``ttft``: no TTFT_* or PYTHON* of the caller, a fresh TTFT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTFT_", "PYTHON", "VIRTUAL_ENV"))}
    env["TTFT_HOME"] = str(home)
    return env


def check(work: Path) -> dict[str, Any]:
    steps = Steps()
    started = time.monotonic()
    source = snapshot(work / "src")
    dist = work / "dist"
    build = [sys.executable, "-m", "build", "--outdir", str(dist)]
    steps.run("build ttft-pipeline", [*build, str(source)])
    steps.run("build ttft-emit", [*build, str(source / "emitter")])
    wheel = next(dist.glob("ttft_pipeline-*.whl"))

    venv = work / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    steps.run("venv", [base, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling every module of ~1 GB of dependencies is a third of the install's time, and
    # the commands below compile what they import anyway.
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile"]
    offline = [*pip, "--no-index", "--find-links", str(WHEELHOUSE), "--find-links", str(dist), str(wheel)]
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    try:
        steps.run("install", offline)
    except StepFailed:  # first use, or new requirements: fill the wheelhouse from the index, then again
        pins = constraints(work / "constraints.txt")
        download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE)]
        steps.run("wheelhouse", [*download, "--find-links", str(dist), "-c", str(pins), str(wheel)])
        steps.run("install", offline)

    run_dir = work / "run"
    run_dir.mkdir()
    env = clean_env(work / "home")
    ttft = str(venv / "bin" / "ttft")
    where = steps.run("import", [str(python), "-c", "import streams, ttft_emit; print(streams.__file__)"], cwd=run_dir)
    steps.run("ttft --version", [ttft, "--version"], cwd=run_dir, env=env)
    steps.run("db migrate", [ttft, "db", "migrate"], cwd=run_dir, env=env)
    steps.run("db migrate again", [ttft, "db", "migrate"], cwd=run_dir, env=env)
    steps.run("worker --help", [ttft, "worker", "--help"], cwd=run_dir, env=env)
    shutil.copy(FILL_STORE, run_dir / FILL_STORE.name)
    fill = [str(python), FILL_STORE.name, "--minutes", "5", "--rate", "5", "--end-ago-min", "10"]
    steps.run("fill store", fill, cwd=run_dir, env=env)
    steps.run("breakdown --json", [ttft, "breakdown", "--json", "--since", "30m"], cwd=run_dir, env=env)

    return {
        "seconds": steps.seconds,
        "total_seconds": round(time.monotonic() - started, 1),
        "outputs": steps.outputs,
        "streams_file": where.strip(),
        "wheels": sorted(p.name for p in dist.glob("*.whl")),
        **compare_shipped(wheel, source),
    }


def compare_shipped(wheel: Path, source: Path) -> dict[str, Any]:
    """The wheel's ``streams/_shipped`` files against the snapshot's folders they were copied from."""
    sys.path.insert(0, str(source))
    try:
        from streams.resources import SHIPPED, SHIPPED_DIR
    finally:
        sys.path.pop(0)
    expected = {
        f"{name}/{path.name}": path.read_bytes()
        for name, (folder, pattern) in SHIPPED.items()
        for path in (source / folder).glob(pattern)
    }
    prefix = f"streams/{SHIPPED_DIR}/"
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n[len(prefix) :]: archive.read(n) for n in archive.namelist() if n.startswith(prefix)}
    return {
        "shipped": sorted(shipped),
        "shipped_missing": sorted(set(expected) - set(shipped)),
        "shipped_extra": sorted(set(shipped) - set(expected)),
        "shipped_differ": sorted(n for n in set(shipped) & set(expected) if shipped[n] != expected[n]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="Keep the temp dir (its path is printed).")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ttft-wheel-"))
    try:
        result = check(work)
    except StepFailed as exc:
        sys.exit(str(exc))
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
