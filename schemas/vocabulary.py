"""The contract's vocabulary, spelled once: stage names, the stage-name rule, reserved identifiers.

Every other module (the event model, the settings, the join, the rules, the views) imports these names
from here; this module imports nothing of the project. docs/design.md, "The contract" and "Join semantics".
"""

from __future__ import annotations

import re
from typing import Final

#: The stages the contract names, in pipeline order.
KNOWN_STAGES: Final[tuple[str, ...]] = (
    "request_start",
    "retrieval",
    "vector_recall",
    "bm25_recall",
    "rerank",
    "prompt_assemble",
    "llm_ttft",
    "first_token",
)
#: Stages that are instants (``ts_ms`` only, no ``duration_ms``).
INSTANT_STAGES: Final[tuple[str, ...]] = ("request_start", "first_token")
#: Stages a request needs to be ``complete`` (per-route overrides live in the settings).
REQUIRED_STAGES: Final[tuple[str, ...]] = ("request_start", "retrieval", "prompt_assemble", "llm_ttft", "first_token")
#: The three spans TTFT splits into (plus the signed ``other`` gap).
PARENT_STAGES: Final[tuple[str, ...]] = ("retrieval", "prompt_assemble", "llm_ttft")
#: Optional sub-stages of retrieval.
SUB_STAGES: Final[tuple[str, ...]] = ("vector_recall", "bm25_recall", "rerank")
#: Parent stage -> its sub-stages, and the reverse.
SUB_STAGES_OF: Final[dict[str, tuple[str, ...]]] = {"retrieval": SUB_STAGES}
SUB_STAGE_PARENT: Final[dict[str, str]] = {sub: parent for parent, subs in SUB_STAGES_OF.items() for sub in subs}

#: A reserved stage name: an LLM call whose first chunk its telemetry does not tell (an OTLP LLM span with no
#: first-chunk attribute or event, streaming or not told apart). Its event spans the whole call. A request
#: with one and no ``first_token`` has the status ``no_first_chunk``; it is never a custom stage.
LLM_UNMEASURED: Final = "llm_unmeasured"

#: Any stage name, known or custom (custom stages are optional and summed like known ones).
STAGE_NAME_PATTERN: Final = r"[a-z][a-z0-9_]{0,47}"
STAGE_NAME_RE: Final = re.compile(STAGE_NAME_PATTERN)

#: The tenant (and version) that series over a cap fold into; no producer may use it.
RESERVED_TENANT: Final = "__other__"


def is_stage_name(name: str) -> bool:
    """True when ``name`` is a valid stage name (known or custom)."""
    return STAGE_NAME_RE.fullmatch(name) is not None
