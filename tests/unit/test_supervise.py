"""The delivery supervisor: a background task that dies is logged, counted and restarted, never lost."""

from __future__ import annotations

import asyncio

import pytest

from streams.alerting.supervise import supervise


def test_a_crashing_task_is_restarted_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> tuple[int, list[str], int]:
        stop = asyncio.Event()
        calls = 0
        reasons: list[str] = []

        async def run() -> None:
            nonlocal calls
            calls += 1
            if calls <= 2:
                raise RuntimeError("boom")
            if calls == 3:
                return  # an unexpected return counts as a death too
            await stop.wait()

        task = asyncio.create_task(supervise("loop", run, stop, on_restart=reasons.append, backoff_initial_s=0.01))
        while calls < 4:
            await asyncio.sleep(0.01)
        stop.set()
        return await asyncio.wait_for(task, 5), reasons, calls

    restarts, reasons, calls = asyncio.run(go())
    assert restarts == 3 and calls == 4
    assert reasons == ["RuntimeError", "RuntimeError", "returned"]
    assert "loop died (RuntimeError)" in caplog.text


def test_stop_during_back_off_returns_promptly() -> None:
    async def go() -> int:
        stop = asyncio.Event()

        async def run() -> None:
            raise ValueError("always")

        task = asyncio.create_task(supervise("loop", run, stop, backoff_initial_s=60.0))
        await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(task, 2)

    assert asyncio.run(go()) == 1


def test_cancellation_propagates() -> None:
    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(supervise("loop", stop.wait, stop))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(go())
