"""Issue 27 item 3 in the writer and the rules: registered tenants keep their series slots against any
number of made-up tenant ids, which share a bounded pool; the silence rule watches registered tenants only."""

from __future__ import annotations

from streams.core.series import OTHER_SERIES, SeriesAdmission
from streams.rules import RuleEngine, WindowEvaluation
from streams.settings import Settings
from tests.unit.rules_synth import Scenario, Traffic, make_engine

REAL = [(t, f"v{i}") for t in ("acme", "globex") for i in range(5)]
SPRAY = [(f"fake-{k}", "v1") for k in range(20_000)]


def test_sprayed_tenants_take_the_registered_tenants_series_slots_without_registration() -> None:
    assignment = SeriesAdmission(100).assign(REAL + SPRAY)
    assert len([s for s in REAL if s in assignment.admitted]) < len(REAL)  # issue 27: slots lost to the spray


def test_registered_tenants_keep_every_series_and_the_spray_shares_the_pool() -> None:
    settings = Settings(tenancy={"registered": ["acme", "globex"], "max_series_pool": 30}, windows={"max_series": 100})
    assignment = SeriesAdmission.from_settings(settings).assign(REAL + SPRAY)
    assert all(s in assignment.admitted for s in REAL)
    pooled = [s for s in assignment.admitted if s not in REAL]
    assert len(pooled) == 30
    assert assignment.resolve("fake-unknown", "v1") == OTHER_SERIES
    assert assignment.overflow_series == len(SPRAY) - 30


def test_the_pool_keeps_its_pinned_series_and_deals_no_more_past_its_room() -> None:
    admission = SeriesAdmission(100, registered=frozenset({"acme", "globex"}), max_pool_series=3)
    pinned = SPRAY[:5]  # stored before (e.g. a smaller cap then): never displaced
    assignment = admission.assign(REAL + SPRAY, pinned)
    assert set(pinned) <= assignment.admitted
    assert len(assignment.admitted) == len(REAL) + 5


def test_registered_tenants_are_dealt_round_robin_when_they_alone_pass_the_cap() -> None:
    admission = SeriesAdmission(6, registered=frozenset({"acme", "globex"}), max_pool_series=50)
    assignment = admission.assign(REAL + SPRAY[:10])
    assert {t for t, _ in assignment.admitted} == {"acme", "globex"}
    assert len(assignment.admitted) == 6  # 3 each: 2 versions and their own __other__


TENANTS = ("t1", "t2", "t3")


def _silence(engine: RuleEngine) -> list[tuple[int, str, str]]:
    # t3 stops after window 3; made-up tenants send one request each in windows 0-2, never again.
    scenario = Scenario(seed=1, arms={(t, "v1"): "stable" for t in TENANTS})
    out: list[tuple[int, str, str]] = []
    for i in range(12):
        traffic = {t: {"v1": Traffic(n=50)} for t in TENANTS if not (t == "t3" and i >= 3)}
        if i < 3:
            traffic |= {f"fake-{i}-{k}": {"v1": Traffic(n=1)} for k in range(40)}
        ws, snap = scenario.window(i, traffic)
        evaluation: WindowEvaluation = engine.evaluate_window(ws, snap)
        out += [(i, t.labels["tenant"], t.state) for t in evaluation.transitions if t.alertname == "TTFTTenantSilent"]
    return out


def test_the_silence_rule_watches_registered_tenants_only() -> None:
    # Issue 27: before registration, a ticket per made-up tenant (121). With the default settings, t1-t3 are
    # promoted by their third window in a row (tenancy.steady_windows); a made-up id seen once never is.
    assert _silence(make_engine()) == [(7, "t3", "firing")]  # last records in window 2: 5 silent windows
    registered = _silence(make_engine(tenancy={"registered": ["t1", "t2", "t3"]}))
    assert registered == [(7, "t3", "firing")]
    # Promotion off: only the listed tenants are watched.
    assert _silence(make_engine(tenancy={"registered": ["t1", "t2"], "steady_windows": 0})) == []


def test_a_tenant_seen_for_fewer_than_steady_windows_is_not_watched() -> None:
    scenario = Scenario(seed=1, arms={(t, "v1"): "stable" for t in TENANTS})
    engine = make_engine()
    transitions = []
    for i in range(10):  # t3 sends in windows 0-1 only: never promoted, so its silence is no ticket
        traffic = {t: {"v1": Traffic(n=50)} for t in TENANTS if not (t == "t3" and i >= 2)}
        ws, snap = scenario.window(i, traffic)
        transitions += [t for t in engine.evaluate_window(ws, snap).transitions if t.alertname == "TTFTTenantSilent"]
    assert transitions == []
    assert engine.tenants.registered == {"t1", "t2"}
