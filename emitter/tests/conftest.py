from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def closed_port() -> Iterator[int]:
    # Bind then close: nothing listens, so a connect is refused at once (loopback only).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    yield port
