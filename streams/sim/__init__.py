"""Traffic simulator: stage events built from a per-request latency model, for demos, tests and load.

Pure and deterministic for a seed (no clock, no I/O); :mod:`streams.sim.produce` sends the messages
to Kafka.
"""

from streams.sim.faults import ErrorRates
from streams.sim.model import RequestProfile, simulate_request, stage_log_correlation
from streams.sim.scenarios import DEFAULT_TENANTS, SCENARIOS, SEED_STORY_TARGETS, incident_tenant, phases
from streams.sim.traffic import Message, SimulationTruth, generate, generate_with_truth

__all__ = [
    "DEFAULT_TENANTS",
    "SCENARIOS",
    "SEED_STORY_TARGETS",
    "ErrorRates",
    "Message",
    "RequestProfile",
    "SimulationTruth",
    "generate",
    "generate_with_truth",
    "incident_tenant",
    "phases",
    "simulate_request",
    "stage_log_correlation",
]
