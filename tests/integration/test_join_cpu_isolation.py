"""Issue 27: the join's CPU per event with the attacks mixed in stays within 20 % of the run without them.

The isolation test (``test_tenant_isolation.py``) mixes into the good tenants' traffic issue 14's hostile
tenant and, since issue 27, that issue's attacks (OTLP spans with NaN, Infinity and 2^64 times, 300 held 4 KB
spans, 20,000 sprayed tenant ids, 2,000 unparseable messages on one partition, a tenant 14 minutes late).
"The run without them" is that test's run without issue 27's attacks: ``issue14``; the run with them is
``mixed``. Each is a fresh join through its whole input as a backlog on the real broker, one join at a time,
three times, interleaved; the median over the rounds of the round's ratio is compared
(:mod:`tests.support.join_cpu`).

Printed beside it, not asserted against 20 %: the good traffic with issue 27's attacks only against the good
traffic alone (``attacks / alone``), and ``mixed / alone``, where issue 14's hostile tenant is in the
numerator only (its 50,000 events cost more per event than good traffic; issue 14 had no CPU bound).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.join_cpu import best, measure_runs, paired_ratio

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.timeout(600)]

#: Issue 27: within 20 % of the run without the attacks.
LIMIT = 1.2
#: Issue 27's attacks over the good traffic alone: a bound against regressions (a sprayed tenant's one-event
#: request is a whole record, where a good request's record is shared by its four events).
ATTACKS_LIMIT = 2.0


def test_issue27_join_cpu_per_event_within_20_percent_of_the_run_without_the_attacks(
    kafka_broker: Any, tmp_path: Path
) -> None:
    kafka_broker.ensure_running()
    # Three passes of the two runs compared, interleaved; one of the two printed readings' runs.
    passes = measure_runs(kafka_broker.bootstrap, tmp_path, ("issue14", "mixed"), rounds=3)
    passes.update(measure_runs(kafka_broker.bootstrap, tmp_path, ("alone", "attacks"), rounds=1))
    for run, runs in passes.items():
        print(
            f"JOIN CPU {run}: "
            + ", ".join(f"{p.us_per_message:.1f} µs/message ({p.cpu_s:.2f} s, {p.wall_s:.1f} s wall)" for p in runs)
            + f" over {runs[0].messages} messages"
        )
    us = {run: best(runs).us_per_message for run, runs in passes.items()}
    ratios = {
        "mixed / issue14": paired_ratio(passes["mixed"], passes["issue14"]),
        "mixed / issue14, best passes": us["mixed"] / us["issue14"],
        "attacks / alone": us["attacks"] / us["alone"],
        "mixed / alone": us["mixed"] / us["alone"],
    }
    print("JOIN CPU PER MESSAGE, best passes:", {k: round(v, 1) for k, v in us.items()})
    print("RATIOS:", {k: round(v, 2) for k, v in ratios.items()})
    assert ratios["mixed / issue14"] <= LIMIT, (ratios, us)
    assert ratios["attacks / alone"] <= ATTACKS_LIMIT, (ratios, us)
