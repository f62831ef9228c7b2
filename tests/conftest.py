"""Shared pytest set-up. Fixtures for real components live in tests/fixtures/ and are opt-in by marker."""

pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.clickhouse",
    "tests.fixtures.alertmanager",
    "tests.fixtures.pipeline_run",
]
