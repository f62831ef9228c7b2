"""The dashboards' JSON model, built with grafana-foundation-sdk (the build for Grafana 11.6) from the specs
of :mod:`streams.grafana.model`.

The SDK has no query type for the ``grafana-clickhouse-datasource`` plugin: :class:`ClickHouseQuery` is one,
written to the SDK's extension point (a ``Dataquery`` variant registered with its runtime, so that
``Dashboard.from_json`` reads the committed files back into the same objects). Grafana's dashboard schema of
that SDK types an annotation's ``target`` as the built-in Grafana annotation query only (limit, matchAny,
tags, type; the schema itself says "TODO: this should be a regular DataQuery"): a ClickHouse annotation query
is :class:`ClickHouseAnnotationTarget`, a subclass that writes the plugin's query there, as Grafana does.
Everything else (panels, field configs and overrides, variables, links, layout) goes through the SDK's
typed builders; :func:`dashboard_json` refuses a spec option the SDK's models would drop.

Two files per board: ``dashboards/<slug>.json`` for file provisioning (the data source by its fixed uid),
and ``deploy/grafana/import/<slug>.json`` for a UI import, with ``__inputs`` (Grafana asks which ClickHouse
data source to use) and ``__requires`` (Grafana and the plugin version).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Self

from grafana_foundation_sdk.builders import barchart as barchart_builder
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.builders import table as table_builder
from grafana_foundation_sdk.builders import timeseries as timeseries_builder
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dashboard_model

from streams.grafana.model import (
    DATASOURCE,
    DATASOURCE_INPUT,
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    FORMAT_TIME_SERIES,
    MAX_DATA_POINTS,
    MIN_INTERVAL,
    PLUGIN_NAME,
    PLUGIN_VERSION,
    AnnotationSpec,
    DashboardSpec,
    DataLink,
    PanelSpec,
    VariableSpec,
    board_url,
    column_unit,
)

#: The Grafana version the SDK build (and deploy/compose.yaml's image) is for.
GRAFANA_VERSION: Final = "11.6.0"
GRID_WIDTH: Final = 24


class ClickHouseQuery(cogvariants.Dataquery):
    """A ``grafana-clickhouse-datasource`` SQL query (editorType ``sql``) as the plugin saves it."""

    def __init__(
        self,
        ref_id: str = "A",
        raw_sql: str = "",
        fmt: int = FORMAT_TIME_SERIES,
        datasource: Mapping[str, str] | None = None,
        plugin_version: str = PLUGIN_VERSION,
    ) -> None:
        self.ref_id = ref_id
        self.raw_sql = raw_sql
        self.fmt = fmt
        self.datasource = dict(datasource if datasource is not None else DATASOURCE)
        self.plugin_version = plugin_version

    def to_json(self) -> dict[str, object]:
        return {
            "refId": self.ref_id,
            "datasource": dict(self.datasource),
            "editorType": "sql",
            "format": self.fmt,
            "queryType": "timeseries" if self.fmt == FORMAT_TIME_SERIES else "table",
            "pluginVersion": self.plugin_version,
            "rawSql": self.raw_sql,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(data["refId"], data["rawSql"], data["format"], data["datasource"], data["pluginVersion"])


class ClickHouseQueryBuilder(cogbuilder.Builder[ClickHouseQuery]):
    def __init__(self, raw_sql: str, fmt: int, ref_id: str = "A") -> None:
        self._internal = ClickHouseQuery(ref_id, raw_sql, fmt)

    def build(self) -> ClickHouseQuery:
        return self._internal


class ClickHouseAnnotationTarget(dashboard_model.AnnotationTarget):
    """An annotation's ``target`` holding the plugin's query (the SDK's schema knows only Grafana's own)."""

    def __init__(self, query: ClickHouseQuery) -> None:
        super().__init__()
        self.query = query

    def to_json(self) -> dict[str, object]:
        return self.query.to_json()


class _AnnotationTargetBuilder(cogbuilder.Builder[dashboard_model.AnnotationTarget]):
    def __init__(self, target: ClickHouseAnnotationTarget) -> None:
        self._internal = target

    def build(self) -> dashboard_model.AnnotationTarget:
        return self._internal


def register_clickhouse_query() -> None:
    """Teach the SDK's runtime to read the plugin's queries back (``Dashboard.from_json``)."""
    cogruntime.register_dataquery_variant(
        cogruntime.DataqueryConfig(identifier=DATASOURCE_TYPE, from_json_hook=ClickHouseQuery.from_json)
    )


register_clickhouse_query()


def _datasource() -> dashboard_model.DataSourceRef:
    return dashboard_model.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)


# --- field config: the spec's few free-form settings, onto the SDK's typed setters ------------------

_STACKING = {"normal": common.StackingMode.NORMAL, "percent": common.StackingMode.PERCENT}
_DRAW = {"bars": common.GraphDrawStyle.BARS, "line": common.GraphDrawStyle.LINE}
_THRESHOLDS_STYLE = {"line+area": common.GraphThresholdsStyleMode.LINE_AND_AREA}
_POINTS = {"never": common.VisibilityMode.NEVER}


def _stacking(value: Mapping[str, str]) -> common_builder.StackingConfig:
    return common_builder.StackingConfig().mode(_STACKING[value["mode"]]).group(value["group"])


def _apply_custom(panel: Any, custom: Mapping[str, Any]) -> None:
    setters = {
        "drawStyle": lambda v: panel.draw_style(_DRAW[v]),
        "stacking": lambda v: panel.stacking(_stacking(v)),
        "fillOpacity": lambda v: panel.fill_opacity(float(v)),
        "thresholdsStyle": lambda v: panel.thresholds_style(
            common_builder.GraphThresholdsStyleConfig().mode(_THRESHOLDS_STYLE[v["mode"]])
        ),
        "showPoints": lambda v: panel.show_points(_POINTS[v]),
        "lineWidth": lambda v: panel.line_width(int(v)),
        "spanNulls": lambda v: panel.span_nulls(v),
    }
    for key, value in custom.items():
        if key not in setters:
            raise ValueError(f"field config custom.{key} has no SDK setter here: add one to streams/grafana/render.py")
        setters[key](value)


def _thresholds(value: Mapping[str, Any]) -> dashboard_builder.ThresholdsConfig:
    steps = [dashboard_model.Threshold(value=s["value"], color=s["color"]) for s in value["steps"]]
    return dashboard_builder.ThresholdsConfig().mode(dashboard_model.ThresholdsMode.ABSOLUTE).steps(steps)


def _apply_field_config(panel: Any, field_config: Mapping[str, Any]) -> None:
    for key, value in field_config.items():
        if key == "custom":
            _apply_custom(panel, value)
        elif key == "thresholds":
            panel.thresholds(_thresholds(value))
        else:
            raise ValueError(f"field config {key} has no SDK setter here: add one to streams/grafana/render.py")


def _override(panel: Any, override: Mapping[str, Any]) -> None:
    matcher = override["matcher"]
    properties = [dashboard_model.DynamicConfigValue(id_val=p["id"], value=p["value"]) for p in override["properties"]]
    if matcher["id"] == "byRegexp":
        panel.override_by_regexp(matcher["options"], properties)
    elif matcher["id"] == "byName":
        panel.override_by_name(matcher["options"], properties)
    else:
        raise ValueError(f"override matcher {matcher['id']} is not supported")


def _link_json(link: DataLink) -> dict[str, Any]:
    return {"title": link.title, "url": link.url, "targetBlank": link.target_blank}


def _column_overrides(panel: Any, spec: PanelSpec) -> None:
    """One override per table column: its unit (never a time unit on a count or a share), its links,
    hidden when only links read it."""
    for column in spec.columns:
        properties: list[dashboard_model.DynamicConfigValue] = []
        unit = column_unit(column)
        if unit is not None:
            properties.append(dashboard_model.DynamicConfigValue(id_val="unit", value=unit))
        if column in spec.links:
            links = [_link_json(link) for link in spec.links[column]]
            properties.append(dashboard_model.DynamicConfigValue(id_val="links", value=links))
        if column in spec.hidden:
            properties.append(dashboard_model.DynamicConfigValue(id_val="custom.hidden", value=True))
        if properties:
            panel.override_by_name(column, properties)


def _legend() -> common_builder.VizLegendOptions:
    # Only order statistics in legends: a mean or sum of percentiles is not a percentile.
    return (
        common_builder.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(["lastNotNull", "max"])
    )


def _tooltip() -> common_builder.VizTooltipOptions:
    return common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)


def _panel_builder(spec: PanelSpec) -> Any:
    if spec.kind == "timeseries":
        series = timeseries_builder.Panel().legend(_legend()).tooltip(_tooltip())
        series.draw_style(common.GraphDrawStyle.LINE).line_width(1).span_nulls(False)
        return series.show_points(common.VisibilityMode.NEVER)
    if spec.kind == "table":
        footer = common_builder.TableFooterOptions().show(False).reducer([])
        return table_builder.Panel().show_header(True).cell_height(common.TableCellHeight.SM).footer(footer)
    if spec.kind == "barchart":
        return (
            barchart_builder.Panel()
            .orientation(common.VizOrientation.HORIZONTAL)
            .stacking(common.StackingMode.NORMAL)
            .show_value(common.VisibilityMode.NEVER)
            .legend(common_builder.VizLegendOptions().show_legend(False))
            .tooltip(common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        )
    raise ValueError(f"panel kind {spec.kind!r} is not built here")


def _panel(spec: PanelSpec, panel_id: int, grid: dashboard_model.GridPos) -> Any:
    panel = _panel_builder(spec)
    panel.id(panel_id).title(spec.title).description(spec.description).datasource(_datasource())
    panel.grid_pos(grid).interval(MIN_INTERVAL).max_data_points(MAX_DATA_POINTS)
    panel.with_target(ClickHouseQueryBuilder(spec.sql, spec.fmt)).unit(spec.unit)
    if spec.options:
        options = dict(spec.options)
        if set(options) != {"xField"} or spec.kind != "barchart":
            raise ValueError(f"panel options {sorted(options)} are not built here")
        panel.x_field(options["xField"])
    _apply_field_config(panel, spec.field_config)
    for override in spec.overrides:
        _override(panel, override)
    if spec.kind in ("table", "barchart"):
        _column_overrides(panel, spec)
    return panel


def _variable(spec: VariableSpec) -> Any:
    if spec.kind == "custom":
        values = spec.sql.split(",")
        return (
            dashboard_builder.CustomVariable(spec.name)
            .label(spec.label)
            .values(spec.sql)
            .multi(False)
            .include_all(False)
            .current(dashboard_model.VariableOption(selected=True, text=spec.default, value=spec.default))
            .options([dashboard_model.VariableOption(selected=v == spec.default, text=v, value=v) for v in values])
            .hide(dashboard_model.VariableHide.DONT_HIDE)
        )
    if spec.kind == "textbox":
        return (
            dashboard_builder.TextBoxVariable(spec.name)
            .label(spec.label)
            .default_value(spec.default)
            .current(dashboard_model.VariableOption(selected=True, text=spec.default, value=spec.default))
            .hide(dashboard_model.VariableHide.DONT_HIDE)
        )
    return (
        dashboard_builder.QueryVariable(spec.name)
        .label(spec.label)
        .datasource(_datasource())
        .query(spec.sql)
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .current(dashboard_model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .options([])
        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC)
        .hide(dashboard_model.VariableHide.DONT_HIDE)
    )


def _annotation(spec: AnnotationSpec) -> dashboard_builder.AnnotationQuery:
    target = ClickHouseAnnotationTarget(ClickHouseQuery("Anno", spec.sql, 1))
    return (
        dashboard_builder.AnnotationQuery()
        .name(spec.name)
        .datasource(_datasource())
        .enable(True)
        .hide(False)
        .icon_color(spec.color)
        .target(_AnnotationTargetBuilder(target))
    )


def _builtin_annotation() -> dashboard_builder.AnnotationQuery:
    return (
        dashboard_builder.AnnotationQuery()
        .name("Annotations & Alerts")
        .datasource(dashboard_model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .type("dashboard")
        .built_in(1)
    )


def _layout(panels: Sequence[PanelSpec]) -> list[dashboard_model.GridPos]:
    grids: list[dashboard_model.GridPos] = []
    x = y = row_height = 0
    for spec in panels:
        if x + spec.width > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        grids.append(dashboard_model.GridPos(h=spec.height, w=spec.width, x=x, y=y))
        x += spec.width
        row_height = max(row_height, spec.height)
    return grids


def _board_link(target: DashboardSpec) -> dashboard_builder.DashboardLink:
    """A link in the board's header to ``target``, carrying the time range and the variables."""
    return (
        dashboard_builder.DashboardLink(target.title)
        .type(dashboard_model.DashboardLinkType.LINK)
        .url(board_url(target.uid, target.slug))
        .tooltip(target.description.split(". ")[0].split(": ")[0].rstrip("."))
        .icon("dashboard")
        .keep_time(True)
        .include_vars(True)
        .target_blank(False)
        .as_dropdown(False)
    )


def encode(value: Any) -> Any:
    """The plain JSON value of an SDK object (its ``to_json``, recursively)."""
    return json.loads(json.dumps(value, cls=JSONEncoder))


def dashboard_json(spec: DashboardSpec, others: Sequence[DashboardSpec] = ()) -> dict[str, Any]:
    """The dashboard model Grafana provisions from ``dashboards/<slug>.json`` (no id, stable uid), with a
    header link to each of ``others``."""
    board = (
        dashboard_builder.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["ttft"])
        .timezone("utc")
        .editable()
        .tooltip(dashboard_model.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("1m")
        .time("now-6h", "now")
        .variables([_variable(v) for v in spec.variables])
        .annotations([_builtin_annotation(), *(_annotation(a) for a in spec.annotations)])
        .links([_board_link(o) for o in others if o.uid != spec.uid])
    )
    for i, (panel, grid) in enumerate(zip(spec.panels, _layout(spec.panels), strict=True)):
        board.with_panel(_panel(panel, i + 1, grid))
    model: dict[str, Any] = encode(board.build())
    return model


def import_json(model: Mapping[str, Any]) -> dict[str, Any]:
    """The same board for a UI import: the data source is an input Grafana asks for (``__inputs``), and
    ``__requires`` names the Grafana and plugin versions it was built for."""
    text = json.dumps(model).replace(json.dumps(DATASOURCE_UID), json.dumps("${" + DATASOURCE_INPUT + "}"))
    out: dict[str, Any] = json.loads(text)
    out["__inputs"] = [
        {
            "name": DATASOURCE_INPUT,
            "label": "ClickHouse (ttft store)",
            "description": "The ClickHouse data source reading the ttft database (read-only user).",
            "type": "datasource",
            "pluginId": DATASOURCE_TYPE,
            "pluginName": PLUGIN_NAME,
        }
    ]
    out["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
        {"type": "datasource", "id": DATASOURCE_TYPE, "name": PLUGIN_NAME, "version": PLUGIN_VERSION},
    ]
    return out
