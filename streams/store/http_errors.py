"""Errors of the store's HTTP interface, as a ClickHouse server returns them.

A server answers a failed query with an HTTP status chosen from the exception code
(``src/Server/HTTP/exceptionCodeToHTTPStatus.cpp``), the header ``X-ClickHouse-Exception-Code`` and a
text body ``Code: N. DB::Exception: <message>. (NAME) (version V)``; clickhouse-connect and clickhouse-go
read the code from either. Errors raised by the engine keep its code, name and text.
"""

from __future__ import annotations

import re

#: Codes the interface raises itself (ClickHouse's ErrorCodes.cpp).
UNKNOWN_SETTING = (115, "UNKNOWN_SETTING")
NOT_IMPLEMENTED = (48, "NOT_IMPLEMENTED")
SYNTAX_ERROR = (62, "SYNTAX_ERROR")
READONLY = (164, "READONLY")
UNKNOWN_USER = (192, "UNKNOWN_USER")
AUTHENTICATION_FAILED = (516, "AUTHENTICATION_FAILED")
UNKNOWN_FORMAT = (73, "UNKNOWN_FORMAT")
BAD_ARGUMENTS = (36, "BAD_ARGUMENTS")
CANNOT_SCHEDULE_TASK = (439, "CANNOT_SCHEDULE_TASK")

_FORBIDDEN = {"UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"}
_BAD_REQUEST = {
    "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
    "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
    "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
    "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
    "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
    "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
    "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
}  # fmt: skip
_NOT_FOUND = {
    "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
    "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
    "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE",
}  # fmt: skip
_OTHER = {
    "REQUIRED_PASSWORD": 401,
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "CANNOT_SCHEDULE_TASK": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}
_ENGINE_ERROR = re.compile(r"Code: (\d+)\. DB::Exception: ")
#: What a server appends to a message, possibly twice when an exception wraps another: ``(NAME)``, ``(version V)``.
_SUFFIX = re.compile(r"[\s.]*\(([A-Z][A-Z0-9_]+|version [^)]*)\)[\s.]*$")


def http_status(name: str) -> int:
    """The HTTP status a ClickHouse server gives an exception named ``name``."""
    if name in _FORBIDDEN:
        return 403
    if name in _BAD_REQUEST:
        return 400
    if name in _NOT_FOUND:
        return 404
    return _OTHER.get(name, 500)


class InterfaceError(Exception):
    """A ClickHouse exception to send back: its code, name and message (without the ``Code:`` prefix)."""

    def __init__(self, error: tuple[int, str], message: str) -> None:
        super().__init__(message)
        self.code, self.name = error
        self.message = message

    @property
    def status(self) -> int:
        return http_status(self.name)

    def body(self, version: str) -> bytes:
        """The response body, as a server writes it."""
        return f"Code: {self.code}. DB::Exception: {self.message}. ({self.name}) (version {version})\n".encode()

    @classmethod
    def from_engine(cls, exc: BaseException) -> InterfaceError:
        """The engine's exception with its own code, name and text (the innermost when one wraps another)."""
        text = str(exc).strip()
        starts = list(_ENGINE_ERROR.finditer(text))
        if not starts:
            return cls((1001, "STD_EXCEPTION"), f"{type(exc).__name__}: {text}")
        message, name = text[starts[-1].end() :], "UNKNOWN_EXCEPTION"
        named = False
        while suffix := _SUFFIX.search(message):
            if not named and not suffix.group(1).startswith("version "):
                name, named = suffix.group(1), True
            message = message[: suffix.start()]
        return cls((int(starts[-1].group(1)), name), message)
