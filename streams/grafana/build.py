"""Build the six dashboards (and the optional Grafana alert rules) from the settings.

The committed ``dashboards/*.json`` (provisioned) and ``deploy/grafana/import/*.json`` (the same boards for
a UI import, with ``__inputs``) are this module's output for the repository's config
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
from streams.grafana.boards_request import request_board
from streams.grafana.boards_stages import stage_drilldown
from streams.grafana.model import DashboardSpec, render
from streams.grafana.render import dashboard_json, import_json
from streams.resources import checkout_dir, default_config_file
from streams.rules_config import RulesConfig
from streams.settings import Settings, load_settings

#: Where ``ttft grafana build`` writes by default: the repository's folders in a checkout, else the current
#: directory's ``dashboards/`` and ``rules.yaml`` (never inside an installed package).
DASHBOARDS_DIR: Final = checkout_dir("dashboards") or Path("dashboards")
#: The boards for a UI import (``__inputs``): not under dashboards/, which the file provider loads.
IMPORT_DIR: Final = checkout_dir("deploy/grafana/import") or Path("import")
RULES_FILE: Final = (checkout_dir("deploy/grafana/provisioning/alerting") or Path(".")) / "rules.yaml"
#: The config the committed files come from: deploy/config/ttft.yaml (an installed wheel ships a copy).
REPO_CONFIG: Final = default_config_file()


def rules_config(settings: Settings) -> RulesConfig:
    """The validated ``rules`` section of the settings."""
    return RulesConfig.model_validate(settings.rules or {})


def dashboard_specs(settings: Settings) -> tuple[DashboardSpec, ...]:
    """The six dashboards, in their documented order (overview -> drill-down -> canary -> request first:
    the order of their header links)."""
    rules = rules_config(settings)
    return (
        overview(settings),
        stage_drilldown(settings),
        canary(rules, settings),
        request_board(settings),
        llm_levers(rules),
        pipeline_health(),
    )


def dashboard_models(settings: Settings) -> dict[str, dict[str, Any]]:
    """``{file name: dashboard JSON model}`` for every dashboard, each linking to the others."""
    specs = dashboard_specs(settings)
    return {f"{spec.slug}.json": dashboard_json(spec, specs) for spec in specs}


def import_models(settings: Settings) -> dict[str, dict[str, Any]]:
    """``{file name: model}`` of the import files: the same boards with the data source as an input."""
    return {name: import_json(model) for name, model in dashboard_models(settings).items()}


def repo_settings() -> Settings:
    """The settings the committed files are generated from: the repository config, environment ignored."""
    config = REPO_CONFIG if REPO_CONFIG.is_file() else None
    # Init arguments beat the environment for these fields only; nothing the dashboards read comes
    # from the environment except through `config`.
    return Settings(config=config) if config is not None else Settings()


def config_settings() -> Settings:
    """``TTFT_CONFIG`` when it is set, else the repository config: what ``ttft grafana`` builds from."""
    return load_settings() if os.environ.get("TTFT_CONFIG") else repo_settings()


def write_dashboards(
    settings: Settings, directory: Path = DASHBOARDS_DIR, import_directory: Path | None = IMPORT_DIR
) -> list[Path]:
    """Write every dashboard JSON into ``directory`` (and its import file into ``import_directory``);
    returns the files whose content changed."""
    outputs = [(directory, dashboard_models(settings))]
    if import_directory is not None:
        outputs.append((import_directory, import_models(settings)))
    changed: list[Path] = []
    for folder, models in outputs:
        folder.mkdir(parents=True, exist_ok=True)
        for name, model in models.items():
            path = folder / name
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
