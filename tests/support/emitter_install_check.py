"""Install the emitter distribution (``emitter/``) alone into a fresh venv, show what it pulled in, use it.

    python tests/support/emitter_install_check.py --python ~/.pyenv/versions/3.9.18/bin/python [--run-tests]

Steps, each printed: a fresh venv from ``--python`` in a temp dir; ``pip install`` of a copy of
``emitter/`` (copied so the build leaves nothing in the checkout); the installed distributions and the
dependency tree of ``ttft-emit`` (from ``importlib.metadata`` inside the venv, no extra tool); a smoke run
of both emitters against a closed port (events buffered, dropped with a counter, stop returns) with
none of the pipeline's dependencies importable; with ``--run-tests``, pytest is added *after* the tree
was taken and the emitter's own tests (``emitter/tests``) run on that interpreter.

Prints one JSON line last: ``{"python": ..., "installed": {name: version}, "tree": [...], ...}``.
Exit status 1 on any failure. Needs the package index (or pip's cache) for aiokafka and orjson.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EMITTER = REPO / "emitter"

#: Printed inside the venv: every installed distribution, and ttft-emit's requirements as a tree.
TREE_SCRIPT = r"""
import json, re
from importlib import metadata

installed = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions()}

def requirements(name):
    out = []
    for req in metadata.requires(name) or []:
        if ";" in req and "extra ==" in req.split(";", 1)[1]:
            continue
        out.append(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-"))
    return out

lines = []
def walk(name, depth, seen):
    lines.append("  " * depth + f"{name}=={installed.get(name, '?')}")
    for child in requirements(name):
        if child not in seen:
            walk(child, depth + 1, seen | {child})

walk("ttft-emit", 0, {"ttft-emit"})
print(json.dumps({"installed": installed, "tree": lines}))
"""

#: Run inside the venv: both emitters without a broker, and none of the pipeline's packages around.
SMOKE_SCRIPT = r"""
import asyncio, importlib.util, json, socket, sys, time
import ttft_emit
from ttft_emit import StageEmitter, ThreadedStageEmitter

heavy = [m for m in ("faust", "chdb", "clickhouse_connect", "matplotlib", "grafana_client", "pydantic", "streams")
         if importlib.util.find_spec(m) is not None]
assert not heavy, f"pipeline packages importable: {heavy}"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]

emitter = ThreadedStageEmitter(f"127.0.0.1:{port}", tenant_id="acme", max_buffer=10, stop_timeout_s=0.5)
emitter.start()
t0 = time.perf_counter()
for i in range(20):
    req = emitter.request(f"r{i}")
    req.request_start()
    with req.stage("retrieval"):
        pass
call_ms = (time.perf_counter() - t0) * 1000 / 40
emitter.stop()
threaded = emitter.stats

async def main():
    e = StageEmitter(f"127.0.0.1:{port}", tenant_id="acme", max_buffer=10, stop_timeout_s=0.5)
    await e.start()
    for i in range(20):
        e.request(f"a{i}").first_token()
    await e.stop()
    return e.stats

asyncio_stats = asyncio.run(main())
assert (threaded.sent, threaded.dropped, threaded.queued) == (0, 40, 0), threaded
assert (asyncio_stats.sent, asyncio_stats.dropped, asyncio_stats.queued) == (0, 20, 0), asyncio_stats
print(json.dumps({"version": ttft_emit.__version__, "python": sys.version.split()[0], "mean_call_ms": call_ms}))
"""


def run(command: list[str], **kwargs: object) -> str:
    shown = [("<script>" if i and command[i - 1] == "-c" else part) for i, part in enumerate(command)]
    print("$ " + " ".join(shown), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stdout}\n{result.stderr}")
    return str(result.stdout)


def copy_emitter(target: Path) -> Path:
    """The emitter's sources without build leftovers or caches."""
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
    shutil.copytree(EMITTER, target, ignore=ignore)
    return target


def check(python: str, work: Path, run_tests: bool) -> dict[str, object]:
    started = time.monotonic()
    venv = work / "venv"
    run([python, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    source = copy_emitter(work / "emitter")
    run([*pip, "install", "-q", str(source)])
    print(run([*pip, "list"]), flush=True)
    tree = json.loads(run([str(venv / "bin" / "python"), "-c", TREE_SCRIPT]))
    print("\n".join(tree["tree"]), flush=True)
    smoke = json.loads(run([str(venv / "bin" / "python"), "-c", SMOKE_SCRIPT], cwd=work))
    print(f"smoke: {smoke}", flush=True)
    tests = None
    if run_tests:
        run([*pip, "install", "-q", "pytest"])
        tests = run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=source)
        print(tests, flush=True)
        tests = tests.strip().splitlines()[-1]
    return {**tree, **smoke, "tests": tests, "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="Interpreter of the fresh venv, e.g. a Python 3.9.")
    parser.add_argument("--run-tests", action="store_true", help="Then run emitter/tests in that venv.")
    parser.add_argument("--keep", action="store_true", help="Keep the temp dir (its path is printed).")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ttft-emit-install-"))
    try:
        result = check(args.python, work, args.run_tests)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
