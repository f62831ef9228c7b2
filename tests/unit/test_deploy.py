"""Static checks of the deployment artefacts in deploy/ (compose, Kubernetes, Dockerfile, ClickHouse users).

No container engine or Kubernetes API runs here (nor in CI), so nothing is started: the files are validated
against bundled schemas (tests/data/compose-spec.json; the Kubernetes schemas of the `kubernetes-validate`
package) and the references between files are checked: mounted paths exist, every TTFT_* variable is a real
Settings field, ConfigMap/Secret keys resolve, probes hit the metrics port, the ClickHouse users and row
policies match the migrated schema. Only the last test touches the embedded ClickHouse engine, to parse
and run the row-policy conditions.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from clickhouse_connect.driver.client import Client
from pydantic import BaseModel

from streams.cli.config_cmd import validate_config
from streams.settings import Settings
from streams.store.migrate import load_migrations, split_statements

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
TTFT_IMAGE_PREFIX = "ttft-pipeline:"
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


# --- helpers ------------------------------------------------------------------------------------------


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
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"].split(",")
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


def test_compose_sets_every_variable_the_grafana_datasource_reads() -> None:
    text = (DEPLOY / "grafana/provisioning/datasources/ttft.yaml").read_text(encoding="utf-8")
    text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    wanted = {a or b or c for a, b, c in re.findall(r"\$(?:__env\{(\w+)\}|\{(\w+)\}|([A-Za-z_]\w*))", text)}
    assert wanted - set(service_env(services()["grafana"])) == set()


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
    assert by_name["FROM"] == ["python:3.11-slim"]
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
        for source in args.split()[:-1]:
            assert (REPO / source).exists(), f"COPY source {source} missing"


# --- Kubernetes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_match_the_kubernetes_schemas(version: str) -> None:
    assert {d["kind"] for _, d in k8s_docs()} >= {
        "Namespace", "ConfigMap", "Secret", "Deployment", "PodDisruptionBudget", "Service",
    }  # fmt: skip
    for path, doc in k8s_docs():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path} {doc['kind']}/{doc['metadata']['name']}: {list(exc.path)}: {exc.message}")


def test_k8s_objects_live_in_the_declared_namespace() -> None:
    (namespace,) = k8s_objects("Namespace")
    for path, doc in k8s_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == namespace, path


def test_k8s_env_vars_are_settings_fields_or_used_in_args() -> None:
    unknown = [key for key in env_file_settings() if not is_settings_env(key)]
    for name, pod in pod_specs():
        for container in containers(pod):
            args = " ".join(container.get("args", []))
            for var in container.get("env", []):
                if not is_settings_env(var["name"]) and f"$({var['name']})" not in args:
                    unknown.append(f"{name}/{container['name']}: {var['name']}")
    assert unknown == []


def test_k8s_config_and_secret_references_resolve() -> None:
    config_maps = {n: set(c.get("data", {})) for n, c in k8s_objects("ConfigMap").items()}
    secrets = {n: set(s.get("stringData", {})) | set(s.get("data", {})) for n, s in k8s_objects("Secret").items()}
    secret_refs = set()
    for name, pod in pod_specs():
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, f"{name}: volume {volume['name']}"
        for container in containers(pod):
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps, f"{name}: envFrom"
            for var in container.get("env", []):
                ref = var.get("valueFrom", {})
                if "secretKeyRef" in ref:
                    secret_refs.add(var["name"])
                    assert ref["secretKeyRef"]["key"] in secrets[ref["secretKeyRef"]["name"]], var["name"]
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["key"] in config_maps[ref["configMapKeyRef"]["name"]]
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in pod.get("volumes", [])}, f"{name}/{container['name']}"
    assert secret_refs == {"TTFT_KAFKA_SASL_PASSWORD", "TTFT_CLICKHOUSE_PASSWORD"}
    assert not {"TTFT_KAFKA_SASL_PASSWORD", "TTFT_CLICKHOUSE_PASSWORD"} & set(env_file_settings())
    assert "@" not in env_file_settings()["TTFT_CLICKHOUSE_URL"], "no credentials in the URL"


def test_k8s_rules_file_is_mounted_as_ttft_config_and_passes_config_check() -> None:
    config_path = PurePosixPath(env_file_settings()["TTFT_CONFIG"])
    (file_key,) = k8s_objects("ConfigMap")["ttft-config"]["data"]
    assert config_path.name == file_key
    for name, pod in pod_specs():
        for container in containers(pod):
            mounts = {m["mountPath"] for m in container["volumeMounts"] if m["name"] == "config"}
            assert mounts == {str(config_path.parent)}, f"{name}/{container['name']}"
    data = yaml.safe_load(k8s_objects("ConfigMap")["ttft-config"]["data"][file_key])
    _, _, problems = validate_config(data)
    assert problems == []


def test_k8s_probes_and_scraping_use_the_metrics_port() -> None:
    metrics_port = int(env_file_settings()["TTFT_METRICS_PORT"])
    for name, pod in pod_specs():
        for container in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports["metrics"] == metrics_port
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                get = container[probe]["httpGet"]
                assert get["path"] == "/healthz", f"{name} {probe}"
                port = get["port"]
                assert (ports[port] if isinstance(port, str) else port) == metrics_port, f"{name} {probe}"
        annotations = k8s_objects("Deployment")[name]["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == metrics_port
    (service,) = k8s_objects("Service").values()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["ports"][0]["port"] == metrics_port


def test_k8s_selectors_match_and_join_replicas_fit_the_partitions() -> None:
    deployments = k8s_objects("Deployment")
    assert set(deployments) == {"ttft-writer", "ttft-join"}
    for deployment in deployments.values():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    join = deployments["ttft-join"]
    assert 1 <= join["spec"]["replicas"] <= int(env_file_settings()["TTFT_PARTITIONS"])
    (pdb,) = k8s_objects("PodDisruptionBudget").values()
    assert pdb["spec"]["selector"]["matchLabels"] == join["spec"]["selector"]["matchLabels"]
    (service,) = k8s_objects("Service").values()
    for deployment in deployments.values():
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    writer_pod = deployments["ttft-writer"]["spec"]["template"]["spec"]
    assert writer_pod["initContainers"][0]["args"] == ["db", "migrate"]


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
        for match in re.finditer(r"CREATE TABLE IF NOT EXISTS \{database\}\.(\w+)\s*\((.*?)\)\s*ENGINE", migration.sql, re.S):
            if re.search(r"^\s*tenant_id\s", match.group(2), re.M):
                tables.add(match.group(1))
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
