"""Static checks of the Kubernetes manifests in deploy/k8s/ (no cluster or container engine runs here).

Every object is validated against the Kubernetes JSON schemas shipped by the `kubernetes-validate` package
(strict: unknown fields fail), for the oldest and newest Kubernetes version we claim. Then the references:
env vars are Settings fields, ConfigMap/Secret keys exist, probes and scraping use the metrics port,
selectors match, the rules ConfigMap passes `ttft config check`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import kubernetes_validate
import pytest
import yaml

from streams.cli.config_cmd import validate_config
from tests.unit.deploy_files import (
    containers,
    env_file_settings,
    is_settings_env,
    k8s_docs,
    k8s_objects,
    pod_specs,
)

K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


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
