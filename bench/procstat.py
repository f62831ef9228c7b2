"""Process accounting from ``/proc``: CPU seconds, current and peak RSS, machine-wide CPU.

``/proc`` rather than psutil: the figures the benchmark needs are three fields, and the parsers are pure
functions of the file text so the tests can check them without processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcSample:
    """One reading of a process: CPU seconds so far (user + system), RSS and peak RSS in bytes."""

    cpu_s: float
    rss_bytes: int
    peak_rss_bytes: int


@dataclass(frozen=True, slots=True)
class MachineSample:
    """Machine-wide CPU seconds since boot: busy (everything but idle and iowait) and total, all cores."""

    busy_s: float
    total_s: float


def parse_stat_cpu_s(stat_text: str, clk_tck: int = _CLK_TCK) -> float:
    """User + system CPU seconds from the text of ``/proc/<pid>/stat``.

    The command name (field 2) may hold spaces and parentheses, so fields are counted after its last ``)``.
    """
    fields = stat_text.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / clk_tck


def parse_status_kib(status_text: str, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (e.g. ``VmRSS``, ``VmHWM``) in bytes; 0 when absent."""
    for line in status_text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def parse_machine_cpu(proc_stat_text: str, clk_tck: int = _CLK_TCK) -> MachineSample:
    """Busy and total CPU seconds from the ``cpu`` line of ``/proc/stat``."""
    for line in proc_stat_text.splitlines():
        if line.startswith("cpu "):
            ticks = [int(x) for x in line.split()[1:]]
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            total = sum(ticks[:8])  # guest time is already inside user/nice
            return MachineSample(busy_s=(total - idle) / clk_tck, total_s=total / clk_tck)
    raise ValueError("no aggregate cpu line in /proc/stat")


def read_proc(pid: int) -> ProcSample:
    """Current accounting of a live process (raises OSError once it is gone)."""
    base = Path(f"/proc/{pid}")
    status = (base / "status").read_text()
    return ProcSample(
        cpu_s=parse_stat_cpu_s((base / "stat").read_text()),
        rss_bytes=parse_status_kib(status, "VmRSS"),
        peak_rss_bytes=parse_status_kib(status, "VmHWM"),
    )


def read_machine() -> MachineSample:
    """Machine-wide CPU counters now."""
    return parse_machine_cpu(Path("/proc/stat").read_text())


def cores_used(before: ProcSample, after: ProcSample, wall_s: float) -> float:
    """Average cores a process used between two samples (1.0 = one core saturated)."""
    return (after.cpu_s - before.cpu_s) / wall_s if wall_s > 0 else 0.0


def machine_busy_share(before: MachineSample, after: MachineSample) -> float:
    """Share of all cores busy between two samples (0..1), whoever used them."""
    total = after.total_s - before.total_s
    return (after.busy_s - before.busy_s) / total if total > 0 else 0.0


MIB = 1024 * 1024
