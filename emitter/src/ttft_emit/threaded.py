"""The emitter of synchronous services (WSGI apps such as Flask or Django, thread pools, scripts).

The request path is the same as the asyncio emitter's: serialise, take the buffer's lock for O(1) work,
append. The sender is the same :class:`~ttft_emit.sender.KafkaSender`, run on a private event loop in one
daemon thread, so a request thread never waits for Kafka, for a connection attempt or for a full
buffer (a full buffer evicts its oldest event, counted as dropped).

Processes: a forked child (gunicorn or uWSGI workers forked after the app was loaded) gets a fresh
buffer, fresh counters and its own sender thread, started in the child right after the fork; the
parent's buffered events stay the parent's. At interpreter exit, started emitters are stopped (what is
buffered is sent within ``stop_timeout_s``), so a service without a shutdown hook loses nothing it could
still send.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from ttft_emit.event import DEFAULT_TOPIC, Rollout
from ttft_emit.sender import KafkaSender
from ttft_emit.timing import EmitterCore

log = logging.getLogger("ttft_emit")

#: Started emitters of this process: stopped at exit, restarted in a forked child.
_STARTED: weakref.WeakSet[ThreadedStageEmitter] = weakref.WeakSet()


class ThreadedStageEmitter(EmitterCore):
    """Publishes stage events of a synchronous service to Kafka without ever blocking a request.

    The same options as :class:`~ttft_emit.StageEmitter`; ``start()`` and ``stop()`` are plain calls.
    The request-path methods (``request()``, ``request_start()``, ``stage()``, ``first_token()``,
    ``record()``) may be called from any number of threads at once. Also a context manager
    (``with ThreadedStageEmitter(...) as emitter:`` starts and stops it).
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = DEFAULT_TOPIC,
        *,
        tenant_id: str,
        version_id: str | None = None,
        route: str | None = None,
        rollout: Rollout | None = None,
        max_buffer: int = 10_000,
        batch_size: int = 500,
        flush_interval_s: float = 0.05,
        retry_backoff_s: tuple[float, float] = (0.1, 5.0),
        stop_timeout_s: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
        monotonic_clock: Callable[[], float] = time.monotonic,
        producer_factory: Callable[..., Any] | None = None,
        **aiokafka_kwargs: Any,
    ) -> None:
        if max_buffer <= 0 or batch_size <= 0:
            raise ValueError("max_buffer and batch_size must be positive")
        super().__init__(
            tenant_id=tenant_id,
            version_id=version_id,
            route=route,
            rollout=rollout,
            max_buffer=max_buffer,
            wall_clock=wall_clock,
            monotonic_clock=monotonic_clock,
        )
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.stop_timeout_s = stop_timeout_s
        self._sender_options: Mapping[str, Any] = {
            "batch_size": batch_size,
            "flush_interval_s": flush_interval_s,
            "retry_backoff_s": retry_backoff_s,
            "stop_timeout_s": stop_timeout_s,
            "producer_factory": producer_factory,
            "producer_kwargs": aiokafka_kwargs,
        }
        self._sender = self._new_sender()
        self._lifecycle = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    def _new_sender(self) -> KafkaSender:
        return KafkaSender(self._buffer, self.bootstrap_servers, self.topic, **self._sender_options)

    @property
    def connected(self) -> bool:
        return self._sender.connected

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start accepting events and the sender thread; returns at once (it connects in the background)."""
        with self._lifecycle:
            if self._thread is not None:
                return
            self._buffer.open()
            self._launch()
            _STARTED.add(self)

    def stop(self) -> None:
        """Stop accepting events, send what is buffered within ``stop_timeout_s``, then disconnect.

        Blocks its caller (a shutdown hook, never a request) for at most about twice ``stop_timeout_s``.
        Events still buffered afterwards are counted as dropped. Never raises; a second call does nothing.
        """
        with self._lifecycle:
            self._buffer.close()
            _STARTED.discard(self)
            thread, loop, stopping = self._thread, self._loop, self._stopping
            self._thread = self._loop = self._stopping = None
            if thread is not None and loop is not None and stopping is not None:
                with contextlib.suppress(RuntimeError):  # the loop already ended (its thread died)
                    loop.call_soon_threadsafe(stopping.set)
                thread.join(2 * self.stop_timeout_s + 1.0)
            self._buffer.discard()

    def __enter__(self) -> ThreadedStageEmitter:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- the sender thread --------------------------------------------------------------------------

    def _launch(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        thread = threading.Thread(target=self._thread_main, args=(loop, ready), name="ttft-emitter", daemon=True)
        self._loop = loop
        thread.start()
        ready.wait()
        self._thread = thread

    def _thread_main(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve(ready))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:  # a bug here must not take the service down: log it, drop what is left
            log.exception("ttft emitter: the sender thread failed")
        finally:
            ready.set()
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        task = asyncio.ensure_future(self._sender.run())
        task.add_done_callback(_log_failure)
        ready.set()
        await self._stopping.wait()
        await self._sender.finish(task)

    def _after_fork_in_child(self) -> None:
        # The parent's sender thread does not exist here, and its lock may have been held at the fork.
        self._lifecycle = threading.Lock()
        self._buffer.reset_after_fork()
        self._new_id_prefix()
        self._sender = self._new_sender()  # the parent's producer belongs to the parent's loop
        self._thread = self._loop = self._stopping = None
        if self._buffer.accepting:
            self._launch()


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("ttft emitter: the sender stopped", exc_info=task.exception())


def _restart_in_child() -> None:
    for emitter in list(_STARTED):
        emitter._after_fork_in_child()


def _stop_at_exit() -> None:
    for emitter in list(_STARTED):
        emitter.stop()


os.register_at_fork(after_in_child=_restart_in_child)
atexit.register(_stop_at_exit)
