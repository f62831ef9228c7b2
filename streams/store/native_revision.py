"""ClickHouse ``Native`` output for a client's protocol revision (the ``client_protocol_version`` URL parameter).

chDB writes ``Native`` as a file format (revision 0): per block, column count, row count, then per column its
name, its type and its data. A ClickHouse server answering an HTTP client that sent
``client_protocol_version=N`` writes what its TCP protocol would: from any revision > 0 each block starts
with a ``BlockInfo``, and from revision 54454 each column's type is followed by a "custom serialization"
flag. clickhouse-go v2 decodes every HTTP response that way (it always sends its revision), and
clickhouse-connect does once its probe shows the server honours the parameter.

:func:`for_client_revision` inserts those bytes. Finding where a column's data ends means walking its type:
fixed-width values, strings, and the nesting of ``Nullable``, ``Array``, ``Map``, ``Tuple`` and
``LowCardinality`` (whose state prefixes precede the data). Types whose layout depends on revision-specific
state (``Variant``, ``Dynamic``, ``JSON``, ``AggregateFunction``) raise :class:`UnsupportedNativeType`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import lru_cache

#: Revisions from which a server writes BlockInfo / the custom-serialization flag (ClickHouse Protocol.h).
BLOCK_INFO_REVISION = 1
CUSTOM_SERIALIZATION_REVISION = 54454
LOW_CARDINALITY_REVISION = 54405
#: BlockInfo as a server writes it: field 1 is_overflows = false, field 2 bucket_num = -1, then field 0.
BLOCK_INFO = b"\x01\x00\x02\xff\xff\xff\xff\x00"

_FIXED = {
    "UInt8": 1, "Int8": 1, "Bool": 1, "Enum8": 1, "Nothing": 1,
    "UInt16": 2, "Int16": 2, "Date": 2, "Enum16": 2, "BFloat16": 2,
    "UInt32": 4, "Int32": 4, "Float32": 4, "Date32": 4, "DateTime": 4, "IPv4": 4, "Time": 4, "Decimal32": 4,
    "UInt64": 8, "Int64": 8, "Float64": 8, "DateTime64": 8, "Time64": 8, "Decimal64": 8,
    "UInt128": 16, "Int128": 16, "UUID": 16, "IPv6": 16, "Decimal128": 16,
    "UInt256": 32, "Int256": 32, "Decimal256": 32,
}  # fmt: skip
#: Geo types are aliases of nested types.
_ALIASES = {
    "Point": "Tuple(Float64, Float64)",
    "Ring": "Array(Point)",
    "LineString": "Array(Point)",
    "MultiLineString": "Array(Ring)",
    "Polygon": "Array(Ring)",
    "MultiPolygon": "Array(Polygon)",
}
_NAMED_ELEMENT = re.compile(r"^(`[^`]*`|[A-Za-z_][A-Za-z0-9_]*)\s+(.+)$", re.S)


class UnsupportedNativeType(ValueError):
    """A column type whose Native layout this module does not walk."""


class TruncatedNative(ValueError):
    """The bytes end inside a block: not a complete Native stream."""


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A parsed type: its name and its parsed arguments (types), or its raw arguments (``Decimal(9, 2)``)."""

    name: str
    args: tuple[ColumnType, ...] = ()
    raw: tuple[str, ...] = ()


def for_client_revision(data: bytes, revision: int) -> bytes:
    """``data`` (chDB's Native output) as a server writes it for a client of protocol ``revision``."""
    if revision < BLOCK_INFO_REVISION or not data:
        return data
    out = bytearray()
    reader = _Reader(data)
    while reader.pos < len(data):
        out += BLOCK_INFO
        start = reader.pos
        columns = reader.varint()
        rows = reader.varint()
        out += data[start : reader.pos]
        for _ in range(columns):
            start = reader.pos
            reader.skip(reader.varint())  # name
            type_name = reader.string()
            out += data[start : reader.pos]
            if revision >= CUSTOM_SERIALIZATION_REVISION:
                out.append(0)  # full serialization: chDB never writes sparse columns to Native
            column = parse_type(type_name)
            if revision < LOW_CARDINALITY_REVISION and _has(column, "LowCardinality"):
                raise UnsupportedNativeType(f"{type_name} for a client below revision {LOW_CARDINALITY_REVISION}")
            start = reader.pos
            if rows:
                _skip_prefix(reader, column)
                _skip_data(reader, column, rows)
            out += data[start : reader.pos]
    return bytes(out)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def skip(self, n: int) -> None:
        self.pos += n
        if self.pos > len(self.data):
            raise TruncatedNative(f"Native data ends at byte {len(self.data)}, {self.pos - len(self.data)} short")

    def varint(self) -> int:
        data, pos, shift, value = self.data, self.pos, 0, 0
        while True:
            if pos >= len(data):
                raise TruncatedNative("Native data ends inside a varint")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7

    def uint64(self) -> int:
        start = self.pos
        self.skip(8)
        return int(struct.unpack_from("<Q", self.data, start)[0])

    def string(self) -> str:
        n = self.varint()
        start = self.pos
        self.skip(n)
        return self.data[start : self.pos].decode("utf-8")


@lru_cache(maxsize=1024)
def parse_type(text: str) -> ColumnType:
    """Parse a ClickHouse type name as it appears in Native output (``Map(String, Nullable(UInt64))``)."""
    text = text.strip()
    name, paren, rest = text.partition("(")
    name = name.strip()
    if name in _ALIASES and not paren:
        return parse_type(_ALIASES[name])
    if not paren:
        return ColumnType(name)
    if not rest.endswith(")"):
        raise UnsupportedNativeType(f"cannot parse the type {text!r}")
    raw = tuple(_split_args(rest[:-1]))
    if name in ("Nullable", "Array", "LowCardinality", "Map"):
        return ColumnType(name, tuple(parse_type(a) for a in raw))
    if name in ("Tuple", "Nested"):
        elements = []
        for arg in raw:
            named = _NAMED_ELEMENT.match(arg)
            elements.append(parse_type(named.group(2) if named and "(" not in named.group(1) else arg))
        return ColumnType(name, tuple(elements))
    if name == "SimpleAggregateFunction":
        return parse_type(raw[-1])
    return ColumnType(name, (), raw)


def _split_args(text: str) -> list[str]:
    """Top-level comma-separated arguments, ignoring commas inside parentheses and quotes."""
    args, depth, quote, start = [], 0, "", 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    args.append(text[start:].strip())
    return [a for a in args if a]


def _has(column: ColumnType, name: str) -> bool:
    return column.name == name or any(_has(a, name) for a in column.args)


def _fixed_width(column: ColumnType) -> int | None:
    if column.name == "Decimal":
        precision = int(column.raw[0])
        return 4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32
    if column.name == "FixedString":
        return int(column.raw[0])
    if column.name.startswith("Interval"):
        return 8
    return _FIXED.get(column.name)


def _skip_prefix(reader: _Reader, column: ColumnType) -> None:
    """The serialization state prefixes, written before any data, depth first."""
    if column.name == "LowCardinality":
        reader.skip(8)  # the keys' serialization version
        return
    for arg in column.args:
        _skip_prefix(reader, arg)


def _skip_data(reader: _Reader, column: ColumnType, rows: int) -> None:
    if rows == 0:
        return
    width = _fixed_width(column)
    if width is not None:
        reader.skip(width * rows)
    elif column.name == "String":
        for _ in range(rows):
            reader.skip(reader.varint())
    elif column.name == "Nullable":
        reader.skip(rows)
        _skip_data(reader, column.args[0], rows)
    elif column.name in ("Array", "Map", "Nested"):
        reader.skip(8 * (rows - 1))
        total = reader.uint64()  # the last offset: how many nested values follow
        elements = column.args if column.name != "Array" else column.args[:1]
        for element in elements:
            _skip_data(reader, element, total)
    elif column.name == "Tuple":
        for element in column.args:
            _skip_data(reader, element, rows)
    elif column.name == "LowCardinality":
        _skip_low_cardinality(reader, column.args[0], rows)
    else:
        raise UnsupportedNativeType(f"column type {column.name} in Native output")


def _skip_low_cardinality(reader: _Reader, inner: ColumnType, rows: int) -> None:
    """Granules of (flags, [dictionary keys], index count, indexes) until ``rows`` indexes were read."""
    keys_type = inner.args[0] if inner.name == "Nullable" else inner
    read = 0
    while read < rows:
        flags = reader.uint64()
        if flags & (1 << 8):  # a global dictionary: only in MergeTree parts, never in Native
            raise UnsupportedNativeType("LowCardinality with a global dictionary in Native output")
        if flags & (1 << 9):  # additional keys in this granule
            _skip_data(reader, keys_type, reader.uint64())
        count = reader.uint64()
        reader.skip(count * (1 << (flags & 0xFF)))
        read += count
