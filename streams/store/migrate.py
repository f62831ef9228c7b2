"""Numbered ClickHouse migrations: ``deploy/clickhouse/migrations/NNNN_name.sql``, applied in order.

An installed wheel carries them as package data (:mod:`streams.resources`); a checkout reads that folder.

Each file may hold several statements, each ending with ``;`` at the end of a line; ``{database}`` is
replaced by the (validated) database name. Applied versions are recorded in
``{database}.schema_migrations``, so running the migrations again applies only new files.

Invariant: every statement must be safe to run twice (``CREATE ... IF NOT EXISTS``, ``ADD COLUMN IF NOT
EXISTS``), because a crash between a file's statements and its record re-runs the whole file.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from streams import resources
from streams.store.client import check_identifier, ensure_database

log = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    """One migration file: ``version`` is its 4-digit number, ``name`` the file stem."""

    version: str
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    def statements(self, database: str) -> list[str]:
        """The file's statements with ``{database}`` substituted."""
        return split_statements(self.sql.replace("{database}", check_identifier(database)))


def migrations_dir() -> Path:
    """The migration files: the wheel's copy when installed, else the repository's
    ``deploy/clickhouse/migrations``."""
    return resources.migrations_dir()


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """All migration files of ``directory`` (default: :func:`migrations_dir`), sorted by version.

    Files that do not look like ``NNNN_name.sql`` are an error, as are two files with the same number.
    """
    directory = directory or migrations_dir()
    found: dict[str, Migration] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix != ".sql":
            continue
        match = _FILE_NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"migration file {path.name!r} must be named NNNN_lowercase_name.sql")
        version = match["version"]
        if version in found:
            raise ValueError(f"two migrations share number {version}: {found[version].name}, {path.stem}")
        found[version] = Migration(version=version, name=path.stem, sql=path.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def split_statements(sql: str) -> list[str]:
    """Split SQL text into statements at a ``;`` that ends a line; comment-only lines never end one."""
    statements: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        current.append(line)
        stripped = line.strip()
        if stripped.endswith(";") and not stripped.startswith("--"):
            _flush(current, statements)
            current = []
    _flush(current, statements)
    return statements


def _flush(lines: list[str], statements: list[str]) -> None:
    text = "\n".join(lines).strip()
    code = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    if code:
        statements.append(text.rstrip(";").rstrip())


def applied_versions(client: Client, database: str) -> dict[str, str]:
    """Version -> checksum of the migrations already applied to ``database`` (empty if none)."""
    db = check_identifier(database)
    _ensure_ledger(client, db)
    result = client.query(f"SELECT version, argMax(checksum, applied_at) FROM {db}.schema_migrations GROUP BY version")
    return {str(version): str(checksum) for version, checksum in result.result_rows}


@dataclass(frozen=True)
class MigrationStep:
    """Progress of :func:`apply_migrations`: statement ``index`` of ``total`` of migration ``name``, reported
    before it runs (``seconds`` ``None``) and after (``seconds`` it took). ``pending``: migrations this run
    applies, this one included. ``summary``: the statement's first code line, shortened."""

    name: str
    index: int
    total: int
    pending: int
    summary: str
    seconds: float | None = None


def apply_migrations(
    client: Client,
    database: str,
    directory: Path | None = None,
    progress: Callable[[MigrationStep], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Create ``database`` if needed and apply the migrations it lacks, in order; return their names.

    Idempotent: a second run applies nothing and returns ``[]``. A changed file that was already applied
    is not re-run (write a new migration instead); its checksum mismatch is logged. ``progress`` hears of
    each statement before and after it runs (a data copy can take minutes on a big table).
    """
    db = check_identifier(database)
    ensure_database(client, db)
    done = applied_versions(client, db)
    migrations = load_migrations(directory)
    for migration in migrations:
        if migration.version in done and done[migration.version] != migration.checksum:
            log.warning("migration %s changed after it was applied to %s", migration.name, db)
    todo = [m for m in migrations if m.version not in done]
    applied: list[str] = []
    for position, migration in enumerate(todo):
        statements = migration.statements(db)
        for index, statement in enumerate(statements, start=1):
            step = MigrationStep(migration.name, index, len(statements), len(todo) - position, _summary(statement))
            if progress is not None:
                progress(step)
            started = clock()
            # A data copy (INSERT ... SELECT) is synchronous like every insert of the project.
            sync = _SYNC if _first_word(statement) == "INSERT" else None
            client.command(statement, settings=sync)
            if progress is not None:
                progress(replace(step, seconds=clock() - started))
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name, migration.checksum]],
            column_names=["version", "name", "checksum"],
            database=db,
            settings={"async_insert": 0, "wait_for_async_insert": 1},
        )
        log.info("applied migration %s to %s", migration.name, db)
        applied.append(migration.name)
    return applied


_SYNC: dict[str, Any] = {"async_insert": 0, "wait_for_async_insert": 1}


def _summary(statement: str, width: int = 72) -> str:
    code = [ln.strip() for ln in statement.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    first = code[0] if code else ""
    return first if len(first) <= width else first[: width - 3] + "..."


def _first_word(statement: str) -> str:
    code = [ln for ln in statement.splitlines() if ln.strip() and not ln.strip().startswith("--")]
    return code[0].split(None, 1)[0].upper() if code else ""


def _ensure_ledger(client: Client, db: str) -> None:
    client.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations ("
        " version String, name String, checksum String,"
        " applied_at DateTime64(3, 'UTC') DEFAULT now64(3, 'UTC')"
        ") ENGINE = ReplacingMergeTree(applied_at) ORDER BY version"
    )
