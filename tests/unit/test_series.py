from __future__ import annotations

import random

import pytest

from streams.core.series import OTHER_SERIES, SeriesAdmission
from streams.settings import Settings, TenantConfig

SERIES = [(f"tenant-{i}", f"v{i % 3}") for i in range(40)]


def test_admission_does_not_depend_on_order_or_instance() -> None:
    shuffled = SERIES[:]
    random.Random(9).shuffle(shuffled)
    first = SeriesAdmission(10).assign(SERIES)
    second = SeriesAdmission(10).assign(shuffled)
    assert first == second
    assert len(first.admitted) == 10
    assert first.overflow_series == 30


def test_overflow_maps_to_other() -> None:
    assignment = SeriesAdmission(3).assign(SERIES)
    folded = [s for s in SERIES if s not in assignment.admitted]
    assert all(assignment.resolve(*s) == OTHER_SERIES for s in folded)
    assert all(assignment.resolve(*s) == s for s in assignment.admitted)
    assert assignment.resolve("never-seen", "v1") == OTHER_SERIES


def test_stable_population_admits_the_same_series_in_every_window() -> None:
    admission = SeriesAdmission(10)
    full = admission.assign(SERIES).admitted
    subset = [s for s in SERIES if s in full or SERIES.index(s) % 2 == 0]
    assert admission.assign(subset).admitted == full


def test_configured_tenants_are_admitted_first() -> None:
    settings = Settings(tenants={"tenant-39": TenantConfig(slo_ms=1_000.0)}, windows={"max_series": 1})
    assignment = SeriesAdmission.from_settings(settings).assign(SERIES)
    assert assignment.admitted == {("tenant-39", "v0")}


def test_pinned_series_keep_their_slot() -> None:
    admission = SeriesAdmission(2)
    ranked_last = [s for s in SERIES if s not in admission.assign(SERIES).admitted][-1]
    assignment = admission.assign(SERIES, pinned=[ranked_last])
    assert ranked_last in assignment.admitted
    assert len(assignment.admitted) == 2


def test_other_is_never_a_series_of_its_own() -> None:
    assignment = SeriesAdmission(1).assign([OTHER_SERIES, ("a", "v")])
    assert assignment.admitted == {("a", "v")}
    assert assignment.resolve(*OTHER_SERIES) == OTHER_SERIES
    assert assignment.overflow_series == 0


def test_max_series_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SeriesAdmission(0)
