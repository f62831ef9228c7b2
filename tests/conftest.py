"""Shared pytest set-up. Fixtures for real components live in tests/fixtures/ and are opt-in by marker."""

import os

import pytest

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.clickhouse",
    "tests.fixtures.alertmanager",
    "tests.fixtures.pipeline_run",
    "tests.fixtures.store_exit",
    "tests.fixtures.otel",
    "tests.fixtures.network_guard",
    "tests.fixtures.scheduling",
    "pytester",
]


#: Test modules still being brought up: they run only when asked (TTFT_RUN_UNPROVEN=1), so an unfinished
#: scenario cannot hang CI. Remove a module from here once it has passed on a clean machine.
UNPROVEN_MODULES: tuple[str, ...] = ()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("TTFT_RUN_UNPROVEN") == "1":
        return
    skip = pytest.mark.skip(reason="unproven fault scenarios; run with TTFT_RUN_UNPROVEN=1 (see the session note)")
    for item in items:
        if any(str(item.path).endswith(m) for m in UNPROVEN_MODULES):
            item.add_marker(skip)
