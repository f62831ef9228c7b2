"""Which statements the store's read-only HTTP interface runs, read from the SQL text before the engine sees it.

The engine's own ``readonly = 1`` refuses writes, DDL, ``SYSTEM``, ``SET`` and the file/URL table functions
(the interface runs every query with it). Two things it lets through are refused here as well: several
statements in one request (chDB executes each of them) and ``SELECT ... INTO OUTFILE`` (chDB writes the
file even in readonly mode), and ``DESCRIBE`` of a table function (readonly mode lets its schema
inference read any file or URL). So a request must hold exactly one statement that reads: ``SELECT``, ``WITH``,
``SHOW``, ``DESCRIBE``/``DESC``, ``EXISTS`` or ``EXPLAIN``.

The text is tokenised the way ClickHouse's lexer reads it (quoted strings and identifiers, typographic
quotes, ``$$`` heredocs, ``--``, ``#`` and nested ``/* */`` comments), so a keyword inside a string or a
comment counts for nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Statements that only read.
READ_STATEMENTS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_SPACE = re.compile(r"\s+")
_HEREDOC = re.compile(r"\$([A-Za-z0-9_]*)\$")
#: Quotes ClickHouse's lexer reads: ASCII ones close themselves; the typographic ones close with their pair.
_QUOTES = {"'": "'", '"': '"', "`": "`", "\u2018": "\u2019", "\u201c": "\u201d"}
#: Refused wherever it appears, even in a string: chDB writes ``INTO OUTFILE`` files in readonly mode, so
#: this check does not depend on the tokeniser reading every quoting form as the engine does.
_OUTFILE = re.compile(r"outfile", re.I)


class StatementRefused(ValueError):
    """The request's SQL is not exactly one read statement."""


@dataclass(frozen=True, slots=True)
class ReadStatement:
    """One read statement: its text (without a trailing ``;``), its kind and its ``FORMAT`` clause, if any."""

    sql: str
    kind: str
    output_format: str | None


def read_statement(sql: str) -> ReadStatement:
    """The one read statement in ``sql``; raises :class:`StatementRefused` otherwise."""
    if _OUTFILE.search(sql):
        raise StatementRefused("INTO OUTFILE writes a file")
    tokens, end = _tokens(sql)
    if not tokens:
        raise StatementRefused("Empty query")
    if ";" in tokens:
        raise StatementRefused("Multi-statements are not allowed: the read-only interface runs one statement")
    first = next((t.upper() for t in tokens if t != "("), "")
    if first not in READ_STATEMENTS:
        raise StatementRefused(f"{first or tokens[0]} is not a read statement")
    if first in ("DESCRIBE", "DESC") and _describes_table_function(tokens):
        raise StatementRefused("DESCRIBE of a table function reads outside the store")
    output_format = None
    if len(tokens) >= 2 and tokens[-2].upper() == "FORMAT" and _WORD.fullmatch(tokens[-1]):
        output_format = tokens[-1]
    return ReadStatement(sql[:end].rstrip(), first, output_format)


def _describes_table_function(tokens: list[str]) -> bool:
    """``DESCRIBE [TABLE] f(...)``: readonly mode does not stop it, and schema inference reads the file or
    URL (a header row becomes column names). ``DESCRIBE (SELECT ...)`` runs its query under readonly."""
    rest = tokens[1:]
    if rest and rest[0].upper() == "TABLE":
        rest = rest[1:]
    while len(rest) >= 3 and rest[1] == ".":  # db.name
        rest = rest[2:]
    return len(rest) >= 2 and rest[0] != "(" and rest[1] == "("


def _tokens(sql: str) -> tuple[list[str], int]:
    """Significant tokens (words, punctuation; strings and quoted identifiers as one token each) and the
    offset just past the last token before a trailing ``;`` (a final ``;`` alone is allowed)."""
    tokens: list[str] = []
    ends: list[int] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch.isspace():
            i = _SPACE.match(sql, i).end()  # type: ignore[union-attr]
            continue
        if sql.startswith("--", i) or ch == "#":
            newline = sql.find("\n", i)
            i = n if newline < 0 else newline + 1
            continue
        if sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
            continue
        start = i
        heredoc = _HEREDOC.match(sql, i) if ch == "$" else None
        if heredoc is not None:
            close = sql.find(heredoc.group(0), heredoc.end())
            if close < 0:
                raise StatementRefused("Unterminated heredoc string")
            i = close + len(heredoc.group(0))
        elif ch in _QUOTES:
            i = _skip_quoted(sql, i, _QUOTES[ch])
        elif word := _WORD.match(sql, i):
            i = word.end()
        else:
            i += 1
        tokens.append(sql[start:i])
        ends.append(i)
    # Trailing semicolons end the statement; any other ';' is a second statement.
    while tokens and tokens[-1] == ";":
        tokens.pop()
        ends.pop()
    return tokens, (ends[-1] if ends else 0)


def _skip_quoted(sql: str, i: int, quote: str) -> int:
    j = i + 1
    while j < len(sql):
        if sql[j] == "\\":
            j += 2
            continue
        if sql[j] == quote:
            if sql.startswith(quote * 2, j):  # a doubled quote stands for itself
                j += 2
                continue
            return j + 1
        j += 1
    raise StatementRefused("Unterminated quoted string or identifier")


def _skip_block_comment(sql: str, i: int) -> int:
    depth, j = 0, i
    while j < len(sql):
        if sql.startswith("/*", j):
            depth += 1
            j += 2
        elif sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    raise StatementRefused("Unterminated comment")
