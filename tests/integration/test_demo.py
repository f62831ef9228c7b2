"""``ttft demo --duration 60``: the CI smoke test of the one-command demo (real broker, workers, store).

Runs the demo as a subprocess without a terminal (plain progress lines), in its own demo home, and checks
what it promises: the replay ranking llm_ttft then retrieval first, each fix predicted on the phase before
it beside the P95 observed after it, the before P95 near 3.2 s, the after P95 beside the sum of stage P95s,
a fired canary alert, a report on disk, and no process left behind.
``ttft demo --otel --duration 30`` (~100 s): tenant otel-demo's traces, from a service traced by the real
OpenInference instrumentation with no ``ttft.*`` attribute, through the real Collector are all stored and
shown beside the emitter's tenants.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from streams.demo.plan import END_MARGIN_MS, WINDOW_MS, plan_demo
from streams.kafka.broker import missing_prerequisite
from streams.otel.instrumentations import instrumentation_python

REPO = Path(__file__).resolve().parents[2]
DEMO = (sys.executable, "-m", "streams.cli.main", "demo")
#: One verdict line per fix of the story (streams/demo/story_whatif.py, FixOutcome.line).
_FIX = re.compile(
    r"^fix ([a-z-]+), predicted on phase [a-z-]+ with .*?: TTFT P95 ([\d,]+) ms \(95 % CI ([\d,]+)-([\d,]+)\) "
    r"over [\d,]+ requests; observed after it ([\d,]+) ms: ([+-][\d.]+)%, (?:inside|outside) the interval; "
    r"naive estimate ([\d,]+) ms \(([+-][\d.]+)%\)$",
    re.M,
)


def _processes_mentioning(text: str) -> list[str]:
    """``pid cmdline`` of every live process whose command line or environment contains ``text``."""
    needle = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (needle in cmdline or needle in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name} {command[:200]}")
    return found


@pytest.fixture
def demo_home(tmp_path: Path) -> Path:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"no local Kafka broker: {reason}")
    return tmp_path / "demo-home"


@pytest.mark.parametrize("duration_s", [60.0, 180.0, 600.0])
def test_plan_phases_are_whole_windows_and_event_time_stays_behind_the_wall_clock(duration_s: float) -> None:
    now_ms = 1_800_000_123_456.0
    plan = plan_demo(duration_s, now_ms)
    phases = plan.phases()
    assert [p.label for p in phases] == [
        "seed-story/before",
        "seed-story/parallel-recall",
        "seed-story/stable-prefix",
        "seed-story/routing-speculative",
        "canary-regression/stable",
        "canary-regression/canary",
    ]
    assert all(p.start_ms % WINDOW_MS == 0 and p.end_ms % WINDOW_MS == 0 for p in phases)
    assert all(a.end_ms == b.start_ms for a, b in pairwise(phases))
    # Paced from now, the story's end is reached after duration_s, END_MARGIN_MS or more behind the clock.
    assert (plan.end_ms - plan.start_ms) / plan.speedup == pytest.approx(duration_s * 1000.0)
    assert now_ms + duration_s * 1000.0 - plan.end_ms >= END_MARGIN_MS
    assert plan.speedup > 1.0


def test_plan_is_deterministic_and_merges_the_parts_in_emission_order() -> None:
    plan = plan_demo(60.0, 1_800_000_000_000.0, seed=3)
    first = list(plan.messages())
    assert first == list(plan.messages())
    stamps = [ts for _, _, ts in first]
    assert stamps == sorted(stamps)
    assert len(first) == pytest.approx(plan.expected_events, rel=0.1)


@pytest.mark.kafka
@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_demo_60s_tells_the_story_and_leaves_nothing_running(demo_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "streams.cli.main", "demo", "--duration", "60", "--home", str(demo_home)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=400,
        check=False,
    )
    seconds = time.monotonic() - started
    text = out.stdout.decode(errors="replace")
    errors = out.stderr.decode(errors="replace")
    assert out.returncode == 0, f"rc={out.returncode} after {seconds:.0f} s\n{text[-6000:]}\n{errors[-3000:]}"

    assert "\x1b[" not in text, "plain output expected without a terminal"
    assert re.search(r"\] producing · produced [\d,]+/", text), "no plain progress lines"

    order = re.search(r"^breakdown \(before\): stage P95s llm_ttft [\d,]+ ms, retrieval [\d,]+ ms", text, re.M)
    assert order, text[-4000:]
    # What to cut first comes from the replay (ttft whatif --rank), for all tenants and for each one.
    ranked = dict(re.findall(r"^what to cut first \(before, ([^)]+)\): (.*)$", text, re.M))
    assert set(ranked) == {"all tenants", "acme", "globex", "bücher-ü"}, text[-4000:]
    assert ranked["all tenants"].endswith("-> cut llm_ttft first, then retrieval"), ranked
    assert all(line.startswith("llm_ttft -") for line in ranked.values()), ranked

    # Each fix predicted on the phase before it, beside the TTFT P95 observed after it (issue 26): the
    # retrieval fix and the prompt-cache fix hold (inside the interval, or within 5 %), the naive estimate's
    # error is shown beside each.
    fixes = {m.group(1): m for m in _FIX.finditer(text)}
    assert set(fixes) == {"parallel-recall", "stable-prefix", "routing-speculative"}, text[-4000:]
    for name in ("parallel-recall", "stable-prefix"):
        fix = fixes[name]
        predicted, lo, hi, observed = (float(fix.group(i).replace(",", "")) for i in (2, 3, 4, 5))
        error, naive_error = float(fix.group(6)), float(fix.group(8))
        assert error == pytest.approx((predicted / observed - 1.0) * 100.0, abs=0.1), fix.group(0)
        assert lo <= observed <= hi or abs(error) <= 5.0, fix.group(0)
        assert naive_error == pytest.approx((float(fix.group(7).replace(",", "")) / observed - 1) * 100, abs=0.1)
    assert "--parallel-recall --scale rerank=0.49:" in fixes["parallel-recall"].group(0)
    assert "--cache-hits 0.84 --cached-share 0.75 --scale prompt_assemble=0.64:" in fixes["stable-prefix"].group(0)
    assert "--route-share fast=0.58:0.4 --scale llm_ttft=0.84:" in fixes["routing-speculative"].group(0)

    before = re.search(r"^before: TTFT P95 ([\d,]+) ms", text, re.M)
    assert before, text[-4000:]
    assert abs(float(before.group(1).replace(",", "")) / 3200.0 - 1.0) <= 0.10

    after = re.search(r"^after: TTFT P95 ([\d,]+) ms beside the sum of stage P95s ([\d,]+) ms", text, re.M)
    assert after, text[-4000:]
    assert after.group(1) != after.group(2)
    assert "they differ" in text

    assert re.search(r"^alert fired: (TTFTCanaryFailed|TTFTDraftAcceptanceLow) .*version=v13", text, re.M), text[-4000:]

    report = demo_home / "report"
    assert f"report written to {report / 'index.html'}" in text
    assert (report / "index.html").is_file() and (report / "report.json").is_file()
    written = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert [line.split(",")[0] for line in written["story"]] == [f"fix {name}" for name in fixes]
    assert all(t["rank"]["rank"][0]["stage"] == "llm_ttft" for t in written["tenants"].values())
    assert "Cut llm_ttft first: 20 % faster it takes" in written["verdict"]
    assert list(report.glob("*.png")), "the report has no charts"

    leftovers = _processes_mentioning(str(demo_home.resolve()))
    assert not leftovers, "processes left running:\n" + "\n".join(leftovers)


def _processes_inside(directory: Path) -> list[str]:
    """``pid cmdline`` of every live process whose working directory is ``directory`` or below it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = (entry / "cwd").resolve()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and cwd.is_relative_to(directory):
            found.append(f"{entry.name} {command[:200]}")
    return found


@pytest.mark.kafka
@pytest.mark.e2e
@pytest.mark.otel
@pytest.mark.timeout(900)
def test_demo_otel_sends_one_tenant_through_the_collector_and_shows_it(demo_home: Path) -> None:
    """``ttft demo --otel --duration 30``: tenant otel-demo's traces reach the store through the real
    Collector, every one of them, and the summary names the way each tenant came in."""
    from streams.otel.collector import default_binary, missing_binary

    problem = missing_binary(default_binary())
    if problem:
        pytest.fail(problem)  # `make test` builds it; a skip would hide a broken build
    instrumentation_python()  # its service's venv, as `make demo-otel` builds it first (once; ~1 min cold)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_")}
    started = time.monotonic()
    out = subprocess.run(
        [*DEMO, "--otel", "--duration", "30", "--no-alertmanager", "--home", str(demo_home)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=280,
        check=False,
    )
    seconds = time.monotonic() - started
    text = out.stdout.decode(errors="replace")
    errors = out.stderr.decode(errors="replace")
    # 1 = the 30 s story missed one of its own promises (e.g. no canary alert on a busy machine): not this
    # test's subject, as long as the OpenTelemetry tenant is not the problem.
    assert out.returncode in (0, 1), f"rc={out.returncode} after {seconds:.0f} s\n{text[-6000:]}\n{errors[-3000:]}"
    assert "OpenTelemetry tenant" not in "\n".join(re.findall(r"^problem: .*", text, re.M)), text[-4000:]
    assert re.search(r"otel collector ready at 127\.0\.0\.1:\d+ \(OTLP gRPC\)", text), text[:3000]

    log = (demo_home / "logs" / "otel-traffic.log").read_text()
    sent = re.search(
        r"otel_traffic: (\d+) traces, (\d+) spans sent .* traced by (\S+) ([\w.]+); ttft\.\* attributes on them: (\d+)",
        log,
    )
    assert sent, log[-2000:]
    traces, spans = int(sent.group(1)), int(sent.group(2))
    assert traces > 200
    assert (sent.group(3), sent.group(4), sent.group(5)) == ("openinference-instrumentation-openai", "0.1.66", "0")

    line = re.search(
        r"^tenant otel-demo: ([\d,]+) requests stored \(TTFT P95 ([\d,]+) ms\), came in as OpenTelemetry traces",
        text,
        re.M,
    )
    assert line, text[-4000:]
    assert int(line.group(1).replace(",", "")) == traces, "every trace the generator sent is one stored request"
    for tenant in ("acme", "globex", "bücher-ü"):
        assert re.search(rf"│ {tenant}\s+│\s+[\d,]+ │ .*│ stage events \(emitter\)", text), text[-4000:]
    counts = re.search(
        r"^otlp spans of otel-demo: ([\d,]+) stage,\s+([\d,]+) not stages,\s+([\d,]+) dead-lettered",
        text,
        re.M,
    )
    assert counts, text[-4000:]
    stage, not_stage, dead = (int(g.replace(",", "")) for g in counts.groups())
    assert (not_stage, dead) == (traces, 0), "one load_session span per trace, nothing dead-lettered"
    assert stage + not_stage == spans

    home = demo_home.resolve()
    leftovers = _processes_mentioning(str(home)) + _processes_inside(home)
    assert not leftovers, "processes left running:\n" + "\n".join(leftovers)
