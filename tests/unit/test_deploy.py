"""Static checks of the deployment artefacts: deploy/compose.yaml, deploy/Dockerfile, deploy/clickhouse/.

No container engine runs here (nor in CI), so nothing is started: these are static checks. compose.yaml is
validated against the bundled compose-spec schema (tests/data/compose-spec.json, see tests/data/README.md)
and the references between files are checked: mounted paths exist, every TTFT_* variable is a real Settings
field, health checks hit the metrics port, Grafana's provisioning and dashboards are where its config says,
the ClickHouse users match what compose passes, the row policies cover every table with a tenant. The two
`clickhouse` tests parse and run the row-policy conditions and the documented TTL statements on the embedded
engine against the migrated schema. The Kubernetes manifests are checked in test_deploy_k8s.py.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import PurePosixPath

import jsonschema
import pytest
import yaml
from clickhouse_connect.driver.client import Client

from streams.store.migrate import load_migrations, split_statements
from tests.unit.deploy_files import (
    DEPLOY,
    REPO,
    bind_mounts,
    compose,
    dockerfile,
    env_file_settings,
    healthz_port,
    is_settings_env,
    service_env,
    services,
    ttft_services,
)

# --- compose ------------------------------------------------------------------------------------------


def test_compose_matches_the_compose_spec_schema() -> None:
    schema = json.loads((REPO / "tests/data/compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft201909Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_compose_bind_mounts_and_build_context_exist_in_the_repo() -> None:
    missing = []
    for name, service in services().items():
        for source, _ in bind_mounts(service):
            if not (DEPLOY / source).exists():
                missing.append(f"{name}: {source}")
        build = service.get("build")
        if build:
            context = DEPLOY / build["context"]
            assert (context / build["dockerfile"]).is_file(), f"{name}: build dockerfile missing"
    assert missing == []


def test_compose_named_volumes_are_declared() -> None:
    declared = set(compose().get("volumes") or {})
    used = {
        str(v).split(":")[0]
        for s in services().values()
        for v in s.get("volumes", [])
        if not str(v).startswith((".", "/"))
    }
    assert used <= declared
    assert used, "stateful services must keep their data in named volumes"


def test_compose_worker_env_vars_are_settings_fields() -> None:
    assert set(ttft_services()) >= {"migrate", "writer", "join"}
    unknown = [
        f"{name}: {var}" for name, s in ttft_services().items() for var in service_env(s) if not is_settings_env(var)
    ]
    assert unknown == []


def test_compose_worker_healthchecks_probe_the_metrics_port() -> None:
    for name in ("writer", "join"):
        service = services()[name]
        command = " ".join(service["healthcheck"]["test"])
        assert healthz_port(command) == int(service_env(service)["TTFT_METRICS_PORT"]), name
        assert service["command"][:2] == ["worker", "--role"] and service["command"][2] == name


def test_compose_start_order_waits_for_health_and_migrations() -> None:
    for name, service in services().items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services(), f"{name} depends on unknown {dependency}"
            if rule["condition"] == "service_healthy":
                target = services()[dependency]
                assert "healthcheck" in target or dependency in ttft_services(), f"{dependency}: no healthcheck"
    for name in ("writer", "join"):
        assert services()[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services()["migrate"]["command"] == ["db", "migrate"]
    assert services()["join"]["deploy"]["replicas"] >= 2


def test_compose_kafka_is_single_node_kraft_without_auto_create() -> None:
    kafka = services()["kafka"]
    env = service_env(kafka)
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", kafka["image"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "kafka-broker-api-versions" in " ".join(kafka["healthcheck"]["test"])
    workers = service_env(services()["writer"])
    assert workers["TTFT_KAFKA_BOOTSTRAP"] in env["KAFKA_ADVERTISED_LISTENERS"]


def test_compose_grafana_gets_the_plugin_provisioning_and_dashboards() -> None:
    grafana = services()["grafana"]
    env = service_env(grafana)
    assert int(grafana["image"].split(":")[1].split(".")[0]) >= 11
    # "<plugin id> <version>": the version the panel SQL is written against (streams/grafana/model.py).
    assert "grafana-clickhouse-datasource 4.20.0" in env["GF_INSTALL_PLUGINS"].split(",")
    mounts = dict(bind_mounts(grafana))
    provisioning = DEPLOY / next(s for s, t in mounts.items() if t == "/etc/grafana/provisioning")
    assert (provisioning / "datasources/ttft.yaml").is_file()
    provider_file = provisioning / "dashboards/ttft.yaml"
    providers = yaml.safe_load(provider_file.read_text(encoding="utf-8"))["providers"]
    dashboards_source, dashboards_target = next((s, t) for s, t in mounts.items() if s.endswith("dashboards"))
    assert (DEPLOY / dashboards_source).resolve() == REPO / "dashboards"
    for provider in providers:
        path, target = PurePosixPath(provider["options"]["path"]), PurePosixPath(dashboards_target)
        if path == target or target in path.parents:
            assert (DEPLOY / dashboards_source / path.relative_to(target)).is_dir()
        else:
            assert path in target.parents, f"dashboards provider path {path} is not the mounted {target}"


def test_compose_sets_every_variable_the_grafana_provisioning_reads() -> None:
    grafana = services()["grafana"]
    provisioning = DEPLOY / next(s for s, t in bind_mounts(grafana) if t == "/etc/grafana/provisioning")
    wanted: set[str] = set()
    for path in sorted(provisioning.rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if "groups" in (yaml.safe_load(text) or {}):
            continue  # alert rules: Grafana leaves their queries ($__timeFilter) and annotations alone
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        found = re.findall(r"(?<!\$)\$(?:__env\{(\w+)\}|\{(\w+)\}|([A-Za-z_]\w*))", text)
        wanted |= {a or b or c for a, b, c in found}
    assert "TTFT_GRAFANA_CLICKHOUSE_PASSWORD" in wanted
    assert wanted - set(service_env(grafana)) == set()


def test_compose_mounts_the_sample_alertmanager_config() -> None:
    alertmanager = services()["alertmanager"]
    assert ("./alertmanager/alertmanager.yml", "/etc/alertmanager/alertmanager.yml") in bind_mounts(alertmanager)
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]


# --- Dockerfile ---------------------------------------------------------------------------------------


def test_dockerfile_builds_a_non_root_ttft_image_with_a_healthz_check() -> None:
    instructions = dockerfile()
    by_name: dict[str, list[str]] = {}
    for name, args in instructions:
        by_name.setdefault(name, []).append(args)
    # The runtime image is slim; a first stage compiles the join's core (its .cache/native is copied on).
    assert by_name["FROM"] == ["python:3.11 AS native", "python:3.11-slim"]
    user = by_name["USER"][-1].split(":")[0]
    assert user not in ("root", "0")
    assert json.loads(by_name["ENTRYPOINT"][-1]) == ["ttft"]
    env = dict(shlex.split(pair)[0].split("=", 1) for pair in re.findall(r"\w+=\S+", " ".join(by_name["ENV"])))
    ttft_env = {k: v for k, v in env.items() if k.startswith("TTFT_")}
    assert [k for k in ttft_env if not is_settings_env(k)] == []
    assert healthz_port(by_name["HEALTHCHECK"][-1].replace("{port}", ttft_env["TTFT_METRICS_PORT"])) == int(
        ttft_env["TTFT_METRICS_PORT"]
    )
    assert by_name["EXPOSE"] == [ttft_env["TTFT_METRICS_PORT"]]
    for args in by_name["COPY"]:
        if args.startswith("--from=native "):
            assert args.split()[1:] == ["/opt/ttft/.cache/native", "./.cache/native"]
            continue
        for source in args.split()[:-1]:
            assert (REPO / source).exists(), f"COPY source {source} missing"
    # The native stage installs from the same sources the runtime stage copies.
    assert "python -m streams.native_build" in " ".join(by_name["RUN"])


# --- ClickHouse users and row policies ----------------------------------------------------------------


def users_xml() -> ET.Element:
    return ET.parse(DEPLOY / "clickhouse/users.xml").getroot()


def test_users_xml_defines_a_readonly_grafana_user_and_the_writer() -> None:
    root = users_xml()
    grafana = root.find("users/grafana_ro")
    assert grafana is not None
    profile = root.find(f"profiles/{grafana.findtext('profile')}")
    assert profile is not None and profile.findtext("readonly") == "1"
    assert [q.text for q in grafana.iterfind("grants/query")] == ["GRANT SELECT ON ttft.*"]
    writer_user = env_file_settings()["TTFT_CLICKHOUSE_USER"]
    assert writer_user == service_env(services()["writer"])["TTFT_CLICKHOUSE_USER"]
    assert root.find(f"users/{writer_user}") is not None
    clickhouse_env = service_env(services()["clickhouse"])
    for user in root.iterfind("users/*"):
        password = user.find("password")
        assert password is not None and not (password.text or "").strip(), f"{user.tag}: no literal passwords"
        assert password.get("from_env") in clickhouse_env, f"{user.tag}: compose must pass its password"


def tenant_tables() -> set[str]:
    tables = set()
    for migration in load_migrations():
        for match in re.finditer(
            r"CREATE TABLE IF NOT EXISTS \{database\}\.(\w+)\s*\((.*?)\)\s*ENGINE", migration.sql, re.S
        ):
            if re.search(r"^\s*tenant_id\s", match.group(2), re.M):
                tables.add(match.group(1))
        # A working table a migration creates and drops again (0008's copy) is not a table of the store.
        tables -= set(re.findall(r"^DROP TABLE \{database\}\.(\w+);", migration.sql, re.M))
    return tables


def row_policy_statements() -> list[str]:
    return split_statements((DEPLOY / "clickhouse/row_policies.sql").read_text(encoding="utf-8"))


def test_row_policies_cover_every_table_with_a_tenant() -> None:
    statements = [re.sub(r"^(--.*\n)+", "", s).strip() for s in row_policy_statements()]
    assert "requests" in tenant_tables() and "tail_attribution" in tenant_tables()
    for table in sorted(tenant_tables()):
        on = f"ON ttft.{table} FOR SELECT USING"
        assert f"GRANT SELECT ON ttft.{table} TO ttft_tenant_viewer" in statements, table
        assert any("ttft_tenant_scope " + on in s and s.endswith("TO ttft_tenant_viewer") for s in statements)
        assert any("ttft_full_access " + on in s and s.endswith("TO ALL EXCEPT ttft_tenant_viewer") for s in statements)
    granted = {m for s in statements for m in re.findall(r"^GRANT SELECT ON ttft\.(\w+)", s)}
    assert granted == tenant_tables(), "tenant readers get exactly the tables with a tenant"


@pytest.mark.clickhouse
def test_row_policy_statements_parse_and_their_conditions_run(ch_client: Client, ch_database: str) -> None:
    for statement in row_policy_statements():
        sql = re.sub(r"^(--.*\n)+", "", statement).strip()
        ch_client.query("SELECT formatQuery({q:String})", parameters={"q": sql})  # ClickHouse's own parser
        match = re.match(r"CREATE ROW POLICY .* ON ttft\.(\w+) FOR SELECT USING (.*) TO ", sql)
        if match:
            # chDB has no custom settings: substitute the tenant the setting would hold.
            condition = match.group(2).replace("getSetting('SQL_ttft_tenant')", "'acme'")
            ch_client.query(f"SELECT count() FROM {ch_database}.{match.group(1)} WHERE {condition}")


# --- docs/operations.md retention statements -----------------------------------------------------------


def documented_ttl_statements() -> list[str]:
    text = (REPO / "docs/operations.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sql\n(.*?)```", text, re.S)
    return [s for block in blocks for s in split_statements(block) if "TTL" in s]


def ttl_days(statement: str) -> int:
    return int(re.search(r"INTERVAL (\d+) DAY", statement).group(1))  # type: ignore[union-attr]


def test_documented_exemplar_ttl_expires_before_the_requests_ttl() -> None:
    statements = documented_ttl_statements()
    (requests,) = [s for s in statements if "ttft.requests MODIFY TTL toDateTime(started_at)" in s]
    (exemplars,) = [s for s in statements if "MODIFY COLUMN exemplar_request_ids" in s]
    assert "toDateTime(window_start)" in exemplars  # window_start <= started_at of every exemplar
    assert ttl_days(exemplars) < ttl_days(requests)


@pytest.mark.clickhouse
def test_documented_ttl_statements_apply_to_the_migrated_schema(ch_client: Client, ch_database: str) -> None:
    for statement in documented_ttl_statements():
        ch_client.command(statement.replace("ttft.", f"{ch_database}."))
