"""Export the contract's JSON Schemas to ``schemas/jsonschema/`` (committed, kept current by a test).

``python -m schemas.export`` rewrites the files; ``python -m schemas.export --check`` writes nothing and
exits 1 when a committed file differs from what the models say.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel

from schemas.dead_letter import DeadLetter
from schemas.events import StageEvent
from schemas.records import RequestRecord

JSONSCHEMA_DIR: Final = Path(__file__).parent / "jsonschema"
_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

#: file stem -> (model, mode). Input is described as validated; outputs as they are serialized.
EXPORTED: Final[dict[str, tuple[type[BaseModel], Literal["validation", "serialization"]]]] = {
    "stage_event": (StageEvent, "validation"),
    "request_record": (RequestRecord, "serialization"),
    "dead_letter": (DeadLetter, "serialization"),
}


def json_schema(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one contract model."""
    return {"$schema": _DIALECT, **model.model_json_schema(mode=mode)}


def rendered_schemas() -> dict[str, str]:
    """File name -> exact file text of every exported schema."""
    return {
        f"{stem}.json": json.dumps(json_schema(model, mode), indent=2, ensure_ascii=False) + "\n"
        for stem, (model, mode) in EXPORTED.items()
    }


def stale_files(directory: Path = JSONSCHEMA_DIR) -> list[str]:
    """Names of the schema files that are missing or differ from the models."""
    stale = []
    for name, text in rendered_schemas().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write_schemas(directory: Path = JSONSCHEMA_DIR) -> list[str]:
    """Write every schema file; returns the names of the files that changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = stale_files(directory)
    for name, text in rendered_schemas().items():
        if name in changed:
            (directory / name).write_text(text, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m schemas.export", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed schemas are stale")
    parser.add_argument("--dir", type=Path, default=JSONSCHEMA_DIR, help="schema directory")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.dir)
        for name in stale:
            print(f"stale: {args.dir / name} (run: python -m schemas.export)", file=sys.stderr)
        return 1 if stale else 0
    for name in write_schemas(args.dir):
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
