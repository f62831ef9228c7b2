"""py-spy around a worker process: collapsed stacks while it runs, then top frames and a flame graph.

Sampling is ``--nonblocking`` (the target is never paused), idle threads are left out, so the shares are
of the process's busy samples. The flame graph is drawn here from the collapsed stacks, so one py-spy
per process gives both the numbers and the picture.
"""

from __future__ import annotations

import html
import re
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.support.pipeline import REPO

PY_SPY = REPO / ".venv" / "bin" / "py-spy"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def start_pyspy(pid: int, out: Path, rate: int = 100) -> subprocess.Popen[bytes]:
    """Record ``pid`` into ``out`` (collapsed stacks) until :func:`stop_pyspy`."""
    cmd = [str(PY_SPY), "record", "--nonblocking", "--format", "raw", "--rate", str(rate)]
    cmd += ["--output", str(out), "--pid", str(pid)]
    log = out.with_suffix(".log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def stop_pyspy(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGINT makes py-spy write its output and exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def parse_collapsed(text: str) -> Counter[tuple[str, ...]]:
    """``frame;frame;... count`` lines -> {stack (root first): samples}."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def short_frame(frame: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (module.py)``: line numbers split one function apart."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m.group('func')} ({Path(m.group('file')).name})"


@dataclass(frozen=True, slots=True)
class FrameShare:
    """A function's share of the busy samples: self (leaf) and inclusive (anywhere on the stack)."""

    frame: str
    self_pct: float
    total_pct: float


def top_frames(stacks: Counter[tuple[str, ...]], n: int = 15) -> list[FrameShare]:
    """The ``n`` functions with the most self time, with their inclusive time."""
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for stack, count in stacks.items():
        names = [short_frame(f) for f in stack]
        own[names[-1]] += count
        for name in set(names):
            incl[name] += count
    return [FrameShare(f, 100.0 * c / total, 100.0 * incl[f] / total) for f, c in own.most_common(n)]


def inclusive_share(stacks: Counter[tuple[str, ...]], pattern: str) -> float:
    """Percent of samples with any frame matching ``pattern`` (regex) on the stack."""
    rx = re.compile(pattern)
    total = sum(stacks.values()) or 1
    hit = sum(c for s, c in stacks.items() if any(rx.search(f) for f in s))
    return 100.0 * hit / total


def flame_svg(stacks: Counter[tuple[str, ...]], title: str, width: int = 1200, row: int = 16) -> str:
    """A plain icicle-style flame graph (root on top) of the collapsed stacks, as SVG text."""
    counts: Counter[tuple[str, ...]] = Counter()
    for stack, count in stacks.items():
        names = tuple(short_frame(f) for f in stack)
        for depth in range(1, len(names) + 1):
            counts[names[:depth]] += count
    total = sum(stacks.values()) or 1
    depth_max = max((len(k) for k in counts), default=0)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{(depth_max + 2) * row}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="4" y="{row - 4}">{html.escape(title)} ({total} samples)</text>',
    ]
    # Children are laid out in name order under their parent, left to right.
    offsets: dict[tuple[str, ...], float] = {(): 0.0}
    for path in sorted(counts, key=lambda p: (len(p), p)):
        parent = path[:-1]
        x = offsets.get(parent, 0.0)
        w = counts[path] / total * width
        offsets[parent] = x + w
        offsets[path] = x
        if w < 0.5:
            continue
        y = len(path) * row
        hue = 20 + sum(path[-1].encode()) % 40  # stable colour per function
        label = html.escape(path[-1])
        pct = 100.0 * counts[path] / total
        parts.append(
            f'<g><title>{label} {pct:.1f}%</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
            f'height="{row - 1}" fill="hsl({hue},85%,60%)"/><text x="{x + 2:.1f}" y="{y + row - 4}">'
            f"{label[: int(w / 7)]}</text></g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
