"""Build the five dashboards (and the optional Grafana alert rules) from the settings.

The committed ``dashboards/*.json`` are this module's output for the repository's config
(``deploy/config/ttft.yaml`` when present, else the defaults); a test keeps them current. Regenerate with
``ttft grafana build`` after changing SLOs or rule thresholds, so dashboards and alerts never fork from
``TTFT_CONFIG``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from streams.grafana.alert_rules import alert_rules, render_rules
from streams.grafana.boards_health import pipeline_health
from streams.grafana.boards_latency import overview
from streams.grafana.boards_levers import canary, llm_levers
from streams.grafana.boards_stages import stage_drilldown
from streams.grafana.model import DashboardSpec, dashboard_json, render
from streams.resources import checkout_dir, default_config_file
from streams.rules_config import RulesConfig
from streams.settings import Settings, load_settings

#: Where ``ttft grafana build`` writes by default: the repository's folders in a checkout, else the current
#: directory's ``dashboards/`` and ``rules.yaml`` (never inside an installed package).
DASHBOARDS_DIR: Final = checkout_dir("dashboards") or Path("dashboards")
RULES_FILE: Final = (checkout_dir("deploy/grafana/provisioning/alerting") or Path(".")) / "rules.yaml"
#: The config the committed files come from: deploy/config/ttft.yaml (an installed wheel ships a copy).
REPO_CONFIG: Final = default_config_file()


def rules_config(settings: Settings) -> RulesConfig:
    """The validated ``rules`` section of the settings."""
    return RulesConfig.model_validate(settings.rules or {})


def dashboard_specs(settings: Settings) -> tuple[DashboardSpec, ...]:
    """The five dashboards, in their documented order."""
    rules = rules_config(settings)
    return (overview(settings), stage_drilldown(), canary(rules), llm_levers(rules), pipeline_health())


def dashboard_models(settings: Settings) -> dict[str, dict[str, Any]]:
    """``{file name: dashboard JSON model}`` for every dashboard."""
    return {f"{spec.slug}.json": dashboard_json(spec) for spec in dashboard_specs(settings)}


def repo_settings() -> Settings:
    """The settings the committed files are generated from: the repository config, environment ignored."""
    config = REPO_CONFIG if REPO_CONFIG.is_file() else None
    # Init arguments beat the environment for these fields only; nothing the dashboards read comes
    # from the environment except through `config`.
    return Settings(config=config) if config is not None else Settings()


def config_settings() -> Settings:
    """``TTFT_CONFIG`` when it is set, else the repository config: what ``ttft grafana`` builds from."""
    return load_settings() if os.environ.get("TTFT_CONFIG") else repo_settings()


def write_dashboards(settings: Settings, directory: Path = DASHBOARDS_DIR) -> list[Path]:
    """Write every dashboard JSON into ``directory``; returns the files whose content changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed: list[Path] = []
    for name, model in dashboard_models(settings).items():
        path = directory / name
        text = render(model)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def rules_text(settings: Settings) -> str:
    """The generated ``provisioning/alerting/rules.yaml`` text (all rules paused)."""
    return render_rules(alert_rules(settings, rules_config(settings)))


def write_rules(settings: Settings, path: Path = RULES_FILE) -> bool:
    """Write the Grafana alert rules file; True when its content changed."""
    text = rules_text(settings)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True
