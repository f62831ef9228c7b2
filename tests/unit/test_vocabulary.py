"""One vocabulary: stage names, the stage-name rule and the reserved tenant are spelled in
``schemas/vocabulary.py`` only, and loading the settings (or the contract) never loads the rule engine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import schemas.events
import streams.core.join_state
import streams.rules.regression
import streams.settings
import streams.views.summary
from schemas import vocabulary

REPO = Path(__file__).resolve().parents[2]


def test_everyone_uses_the_vocabulary_objects() -> None:
    assert schemas.events.KNOWN_STAGES is vocabulary.KNOWN_STAGES
    assert schemas.events.RESERVED_TENANT is vocabulary.RESERVED_TENANT
    assert frozenset(vocabulary.INSTANT_STAGES) == schemas.events.INSTANT_STAGES
    assert streams.settings.KNOWN_STAGES is vocabulary.KNOWN_STAGES
    assert streams.settings.PARENT_STAGES is vocabulary.PARENT_STAGES
    assert streams.rules.regression.SUB_STAGES_OF is vocabulary.SUB_STAGES_OF
    assert streams.views.summary.SUB_STAGE_PARENT is vocabulary.SUB_STAGE_PARENT
    assert tuple(streams.core.join_state.STAGE_CODES) == vocabulary.KNOWN_STAGES


def test_the_stage_name_rule_is_spelled_once() -> None:
    pattern = re.escape(vocabulary.STAGE_NAME_PATTERN)
    spelled = [
        str(p.relative_to(REPO))
        for top in ("schemas", "streams")
        for p in (REPO / top).rglob("*.py")
        if re.search(rf"(?<!`){pattern}(?!`)", p.read_text(encoding="utf-8"))
    ]
    assert spelled == ["schemas/vocabulary.py"]


def test_stage_event_pattern_follows_the_vocabulary() -> None:
    for name, ok in (("retrieval", True), ("my_stage2", True), ("Bad", False), ("a" * 49, False), ("9x", False)):
        assert vocabulary.is_stage_name(name) is ok
    schema = schemas.events.StageEvent.model_json_schema()
    assert schema["properties"]["stage"]["pattern"] == f"^{vocabulary.STAGE_NAME_PATTERN}$"


def test_settings_and_contract_do_not_load_the_rule_engine() -> None:
    code = (
        "import sys, streams.settings, schemas.decode, schemas.events; "
        "print(sorted(m for m in sys.modules if m == 'streams.rules' or m.startswith('streams.rules.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
