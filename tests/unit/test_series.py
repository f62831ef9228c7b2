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


# --- issue 14 item 5: caps per tenant ---------------------------------------------------------------


def test_one_tenants_many_versions_fold_into_its_own_other() -> None:
    """One tenant with 5,000 versions used to fold 41 of 50 other tenants into __other__."""
    noisy = [("noisy", f"v{i}") for i in range(5_000)]
    others = [(f"tenant-{i}", "v1") for i in range(50)]
    assignment = SeriesAdmission(1_000, max_versions_per_tenant=50).assign(noisy + others)
    assert all(assignment.resolve(*s) == s for s in others)  # every other tenant keeps its series
    kept = [s for s in noisy if assignment.resolve(*s) == s]
    assert len(kept) == 50
    assert all(assignment.resolve(*s) == ("noisy", "__other__") for s in noisy if s not in kept)
    assert assignment.overflow_series == 4_950
    assert assignment.overflow_into(("noisy", "__other__")) == 4_950
    assert assignment.overflow_into(OTHER_SERIES) == 0


def test_the_overall_cap_is_dealt_round_robin_over_tenants() -> None:
    series = [(f"t{t}", f"v{v}") for t in range(4) for v in range(10)]
    assignment = SeriesAdmission(12, max_versions_per_tenant=50).assign(series)
    per_tenant: dict[str, int] = {}
    for s in assignment.admitted:
        per_tenant[s[0]] = per_tenant.get(s[0], 0) + 1
    assert per_tenant == {"t0": 3, "t1": 3, "t2": 3, "t3": 3}  # 2 versions + the tenant's own __other__
    assert all(assignment.resolve(*s)[0] == s[0] for s in series)  # nobody folds into another tenant's row


def test_per_tenant_admission_is_order_independent_and_keeps_pinned() -> None:
    series = [("a", f"v{i}") for i in range(20)] + [("b", f"v{i}") for i in range(3)]
    admission = SeriesAdmission(100, max_versions_per_tenant=5)
    shuffled = series[:]
    random.Random(3).shuffle(shuffled)
    assert admission.assign(series) == admission.assign(shuffled)
    dropped = [s for s in series if admission.assign(series).resolve(*s) != s]
    late = dropped[0]
    assert admission.assign(series, pinned=[late]).resolve(*late) == late
