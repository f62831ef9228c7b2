from __future__ import annotations

from typing import Any

import numpy as np

from streams.views.canary import compare_arms
from tests.unit.rules_synth import sketch

W = 60_000
START = 1_800_000_000_000 // W * W


def rows(version: str, windows: range, median: float, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in windows:
        sk = sketch(median * np.exp(0.3 * rng.standard_normal(400)))
        out.append(
            {
                "window_start": START + i * W,
                "tenant_id": "acme",
                "version_id": version,
                "stage": "ttft",
                "count": sk.count,
                "bins": sk.bins,
                "zero_count": 0,
                "relative_accuracy": 0.01,
                "max": 0.0,
                "windows": 1,
            }
        )
    return out


def test_arms_are_compared_over_the_windows_both_had_traffic_only() -> None:
    # Stable: a slow "before" phase (windows 0-9), then normal (10-19). The canary runs in 10-19 only,
    # 20 % slower than stable there. Over the whole span stable would look as slow as the canary.
    stable = rows("v1", range(0, 10), 3_000.0, 1) + rows("v1", range(10, 20), 1_000.0, 2)
    canary = rows("v13", range(10, 20), 1_200.0, 3)
    comp = compare_arms("acme", {"v1": "stable", "v13": "canary"}, stable + canary, [])
    assert comp.arm_windows["stable"] == comp.arm_windows["canary"] == tuple(START + i * W for i in range(10, 20))
    assert comp.stages["stable"]["ttft"].count == comp.stages["canary"]["ttft"].count == 10 * 400
    ratio = comp.ratio("ttft")
    assert ratio is not None and 1.1 < ratio < 1.3  # slower, as it is: not "faster than stable"
    assert comp.span_text().startswith("over 10 windows where both arms had traffic (")
    assert comp.to_json()["windows"] == list(comp.windows)


def test_no_overlap_compares_nothing_and_says_so() -> None:
    comp = compare_arms(
        "acme",
        {"v1": "stable", "v13": "canary"},
        rows("v1", range(0, 5), 1_000.0, 1) + rows("v13", range(5, 10), 1_000.0, 2),
        [],
    )
    assert comp.windows == () and comp.stages["canary"] == {} and comp.ratio("ttft") is None
    assert comp.span_text() == "no window where both arms had traffic"
