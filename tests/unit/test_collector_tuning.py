"""Every worker freezes its start-up objects and makes full collections rarer (streams/app/runner.py)."""

from __future__ import annotations

import gc

from streams.app.runner import GC_THRESHOLDS, tune_collector


def test_tune_collector_freezes_and_sets_the_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        # The young generations keep CPython's defaults; only the full collection is rarer.
        assert GC_THRESHOLDS[:2] == (700, 10) and GC_THRESHOLDS[2] > 10
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
