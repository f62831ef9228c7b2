"""The demo's home directory, its children's environment and its signal handling.

The demo home holds everything one run creates (broker data, the store, logs, the report) and is wiped
at the start of the next run; only a directory a demo created (it holds :data:`MARKER`) or an empty one
is ever wiped. The children get the caller's environment minus every ``TTFT_*`` setting, plus the demo's
own, so the demo never writes into the caller's broker or store; the demo process loads the very same
settings (:func:`settings_for`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Final

from streams.settings import Settings, load_settings


class DemoError(RuntimeError):
    """The demo could not run (prerequisite missing, a component failed); the message says why."""


MARKER: Final = ".ttft-demo"
APP_ID: Final = "ttft-demo"
#: Environment the children keep from the caller; every other TTFT_* variable is the demo's own. The store's
#: HTTP interface settings are kept: another demo or a ClickHouse server may hold port 8123.
#: Where alerts lead is the caller's to say too (docs/runbook.md, "Links").
KEPT_ENV: Final = (
    "TTFT_KAFKA_LIBS",
    "TTFT_STORE__HTTP_PORT",
    "TTFT_STORE__HTTP_HOST",
    "TTFT_STORE__HTTP_PASSWORD",
    "TTFT_RULES__RUNBOOK_BASE_URL",
    "TTFT_RULES__GRAFANA_URL",
)
#: The runbook of a source checkout (a wheel ships no docs/).
CHECKOUT_RUNBOOK: Final = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
IDLE_TICK_MS: Final = 10_000


def default_home() -> Path:
    """``$TTFT_HOME/demo`` (``.ttft/demo`` by default)."""
    return Path(os.environ.get("TTFT_HOME") or ".ttft") / "demo"


def prepare_home(home: Path) -> Path:
    """Wipe and recreate the demo home; refuses a non-empty directory the demo did not create."""
    home = home.resolve()
    if home.exists() and any(home.iterdir()) and not (home / MARKER).exists():
        raise DemoError(f"{home} is not empty and is not a demo home ({MARKER} missing); choose another --home")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / MARKER).write_text("created by `ttft demo`; wiped at the start of each demo run\n")
    return home


def demo_env(home: Path, bootstrap: str, alertmanager_url: str | None) -> dict[str, str]:
    """The children's environment: the caller's, minus its TTFT_* settings, plus the demo's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTFT_") or k in KEPT_ENV}
    env.update(
        TTFT_HOME=str(home),
        TTFT_KAFKA_BOOTSTRAP=bootstrap,
        TTFT_TOPIC_PREFIX="ttft",
        TTFT_APP_ID=APP_ID,
        TTFT_SESSION_TIMEOUT_S="6",
        # One join worker, so one partition: records then reach the writer in event-time order and its
        # watermark follows the data. With several partitions a worker that lags on one of them lets the
        # others' records move the writer's watermark on, and at 10-20x compression the 40 s window grace
        # is a couple of wall seconds of skew: windows would close early and be amended, and the rules,
        # which judge a window when it closes, would judge it half-filled.
        TTFT_PARTITIONS="1",
        # A worker that gets no CPU for a few seconds on a busy machine must not be taken for an idle
        # stream: on compressed historical traffic the idle tick moves the watermark towards the wall
        # clock, minutes ahead of the story. Costs ~10 s more draining at the end.
        TTFT_JOIN__IDLE_TICK_MS=str(IDLE_TICK_MS),
    )
    if alertmanager_url:
        env["TTFT_ALERTMANAGER_URL"] = alertmanager_url
    if "TTFT_RULES__RUNBOOK_BASE_URL" not in env and CHECKOUT_RUNBOOK.is_file():
        env["TTFT_RULES__RUNBOOK_BASE_URL"] = CHECKOUT_RUNBOOK.as_uri()  # the demo's alerts open this checkout's
    return env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Within the block, ``os.environ``'s TTFT_* variables are exactly those of ``env``.

    ``load_settings()`` and the store client read ``os.environ``; the demo's own view must equal its
    children's.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith("TTFT_")}
    for key in saved:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k.startswith("TTFT_")})
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("TTFT_")]:
            del os.environ[key]
        os.environ.update(saved)


def settings_for(env: dict[str, str]) -> Settings:
    """The settings a child started with ``env`` loads."""
    with environment(env):
        return load_settings()


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` so the clean-up runs; restored on exit.

    SIGINT gets Python's own handler back even when the demo was started with SIGINT ignored (a
    background job of a non-interactive shell), so Ctrl-C and ``kill -INT`` always stop the demo cleanly.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    wanted: dict[signal.Signals, Callable[[int, FrameType | None], object]] = {
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: handler,
        signal.SIGHUP: handler,
    }
    previous: dict[signal.Signals, object] = {}
    try:
        for signum, new in wanted.items():
            previous[signum] = signal.signal(signum, new)
    except ValueError:  # not the main thread: signals go to the main thread anyway
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)  # type: ignore[arg-type]
