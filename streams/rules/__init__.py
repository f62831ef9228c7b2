"""Alert rules as a pure core: closed windows in, alert transitions and canary verdicts out.

Entry points: :class:`RuleEngine` (``evaluate`` / ``evaluate_window``), :class:`RulesConfig` (the
``rules`` section of ``TTFT_CONFIG``), and the rows it emits (:class:`AlertTransition`,
:class:`CanaryVerdict`). Nothing here does I/O or reads a clock.
"""

from streams.rules.engine import RuleEngine
from streams.rules.model import (
    ALERT_COLUMNS,
    ALERT_NAMES,
    DECIDED_OUTCOMES,
    RULE_EVALUATION_COLUMNS,
    AlertTransition,
    CanaryVerdict,
    RuleEvaluation,
    WindowEvaluation,
    WindowSnapshot,
    fingerprint,
    ingest_halted_transition,
)
from streams.rules_config import RulesConfig, rules_config

__all__ = [
    "ALERT_COLUMNS",
    "ALERT_NAMES",
    "DECIDED_OUTCOMES",
    "RULE_EVALUATION_COLUMNS",
    "AlertTransition",
    "CanaryVerdict",
    "RuleEngine",
    "RuleEvaluation",
    "RulesConfig",
    "WindowEvaluation",
    "WindowSnapshot",
    "fingerprint",
    "ingest_halted_transition",
    "rules_config",
]
