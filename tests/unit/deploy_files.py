"""Loaders for the deployment files checked by test_deploy.py and test_deploy_k8s.py (no engine runs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from streams.settings import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
TTFT_IMAGE_PREFIX = "ttft-pipeline:"


def is_settings_env(name: str) -> bool:
    """True when ``name`` is read by :class:`Settings`: TTFT_ + field, sections nested with ``__``."""
    if not name.startswith("TTFT_"):
        return False
    model: type[BaseModel] = Settings
    parts = name[len("TTFT_") :].lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        if i == len(parts) - 1:
            return True
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:  # dict-valued sections (tenants, rules) take free keys below them
            return getattr(annotation, "__origin__", None) is dict
    return False


@cache
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def ttft_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if str(s.get("image", "")).startswith(TTFT_IMAGE_PREFIX)}


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def bind_mounts(service: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(source, target) of every bind mount; named volumes are skipped."""
    for volume in service.get("volumes", []):
        source, target = (volume["source"], volume["target"]) if isinstance(volume, dict) else volume.split(":")[:2]
        if source.startswith((".", "/")):
            yield source, target


@cache
def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append((str(path.relative_to(REPO)), doc))
    return docs


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs() if d["kind"] == kind}


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deployment in k8s_objects("Deployment").items():
        yield name, deployment["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def env_file_settings() -> dict[str, str]:
    data: dict[str, str] = k8s_objects("ConfigMap")["ttft-env"]["data"]
    return data


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in joined.splitlines() if ln.strip()]


def healthz_port(command: str) -> int:
    match = re.search(r"127\.0\.0\.1:(\d+)/healthz", command)
    assert match, f"no http://127.0.0.1:<port>/healthz in {command!r}"
    return int(match.group(1))
