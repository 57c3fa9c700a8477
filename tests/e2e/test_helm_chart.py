"""The Helm chart, rendered by Helm itself and applied to a real API server.

Rendering uses Helm's own Go SDK (v4, through the `helm-python-sdk` wheel's C binding, in the test
extra), not a re-implementation of Go templates: what is checked is what `helm install` would send.
Then the rendered objects are created on the control plane of the e2e session, and the real RBAC
authorizer is asked (SubjectAccessReview) what the chart's ServiceAccount may do.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from inferasim_e2e_support import REPO, skip_or_fail

CHART = REPO / "charts" / "inferasim-operator"
RELEASE = "inferasim"


def _helm() -> Any:
    try:
        import helm_python
    except (ImportError, OSError) as exc:  # OSError: the native library failed to load
        skip_or_fail(f"helm-python-sdk is not usable here ({exc}); pip install -e '.[test]'")
    return helm_python


def render(values: dict[str, Any] | None = None, namespace: str = "inferasim-system") -> list[dict[str, Any]]:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values or {}, name=RELEASE, namespace=namespace)
    docs = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
    # Helm puts rendered objects in the release namespace only where the template says so; the
    # namespaced ones must all say so, or `helm template | kubectl apply` lands them elsewhere.
    # Roles and RoleBindings go to the watched namespaces (the release's by default).
    watched = set((values or {}).get("watchNamespaces") or [namespace])
    for d in docs:
        if d["kind"] in ("Role", "RoleBinding"):
            assert d["metadata"].get("namespace") in watched | {namespace}, d["metadata"]
        elif d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"].get("namespace") == namespace, d["kind"]
    return docs


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One object per kind; Roles and RoleBindings by "Kind namespace/name" (there is one per watched
    namespace, and one more in the operator's)."""
    out: dict[str, dict[str, Any]] = {}
    for d in docs:
        key = d["kind"]
        if key in ("Role", "RoleBinding"):
            key = f"{key} {d['metadata']['namespace']}/{d['metadata']['name']}"
        assert key not in out, f"two {key} objects"
        out[key] = d
    return out


def test_chart_lints_clean() -> None:
    report = _helm().lint(str(CHART))
    assert report["errors"] == []
    # Severity 1 is INFO (e.g. "icon is recommended"); nothing at WARNING (2) or ERROR (4).
    assert all(m["severity"] < 2 for m in report["messages"]), report["messages"]


def test_default_render_is_least_privilege_and_consistent() -> None:
    from inferasim_operator.rbac import NAMESPACE_RULES, OPERATOR_NAMESPACE_RULES, cluster_role

    objs = by_kind(render())
    ns, full = "inferasim-system", f"{RELEASE}-inferasim-operator"
    assert set(objs) == {"ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount",
                         f"Role {ns}/{full}", f"RoleBinding {ns}/{full}", f"Role {ns}/{full}-self",
                         f"RoleBinding {ns}/{full}-self"}
    role = objs["ClusterRole"]
    assert role["rules"] == cluster_role("x")["rules"]  # the rules the e2e operator runs under
    # No watchNamespaces: the release's namespace only, with the namespaced rules there.
    assert objs[f"Role {ns}/{full}"]["rules"] == NAMESPACE_RULES
    assert objs[f"Role {ns}/{full}-self"]["rules"] == OPERATOR_NAMESPACE_RULES
    assert objs[f"RoleBinding {ns}/{full}"]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                           "name": full}
    for rule in role["rules"] + NAMESPACE_RULES + OPERATOR_NAMESPACE_RULES:
        assert "secrets" not in rule["resources"] and "*" not in rule["resources"] and "*" not in rule["verbs"]
    sa = objs["ServiceAccount"]["metadata"]["name"]
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "inferasim-system"}]
    pod = objs["Deployment"]["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == sa
    assert objs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # the GPU prices ConfigMap: named by values, read in the operator's own namespace; none by default
    assert env["INFERASIM_PRICE_CONFIGMAP"] == "inferasim-gpu-prices"
    assert env["INFERASIM_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["INFERASIM_METRICS_PORT"] == str(ports["metrics"])
    # passive anchors and prediction error: the operator's defaults, settable through values
    assert (env["INFERASIM_PASSIVE_WINDOW_S"], env["INFERASIM_PASSIVE_STEP_S"],
            env["INFERASIM_PREDICTION_WINDOW_S"]) == ("3600", "60", "300")
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in container["args"]
    # No image tag in values: the chart's appVersion.
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"].endswith(f":{app_version}")
    assert env["INFERASIM_HARVESTER_IMAGE"] == container["image"]
    # The chart's engine images reach the operator as its own parser reads them.
    from inferasim_operator.settings import Settings

    settings = Settings.from_env({"INFERASIM_ENGINE_IMAGES": env["INFERASIM_ENGINE_IMAGES"],
                                  "INFERASIM_PROMETHEUS_URL": env["INFERASIM_PROMETHEUS_URL"]})
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert settings.engine_images == {(v, e): img for v, engines in values["engineImages"].items()
                                      for e, img in engines.items() if img}
    assert ("amd", "vllm") in settings.engine_images and settings.prometheus_url == ""
    assert [a for a in container["args"] if a.startswith("--namespace=")] == [f"--namespace={ns}"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    svc = objs["Service"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_values_change_what_is_rendered() -> None:
    objs = by_kind(render({
        "watchNamespaces": ["team-a", "team-b"],
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}}},
        "image": {"repository": "registry.example/inferasim-operator", "tag": "1.2.3"},
        "operator": {"stage2Top": 20, "harvesterImage": "registry.example/harvester:9"},
        "prices": {"configMap": "gpu-prices", "gpus": {"MI355X": 2.5, "H200": "3.1"}},
        "prometheus": {"url": "http://prometheus.monitoring:9090"},
        "engineImages": {"amd": {"vllm": "reg/vllm-rocm:2", "sglang": "reg/sglang-rocm:2", "atom": ""}},
    }, namespace="ops"))
    prices = objs["ConfigMap"]
    assert prices["metadata"]["name"] == "gpu-prices" and prices["metadata"]["namespace"] == "ops"
    assert prices["data"] == {"MI355X": "2.5", "H200": "3.1"}
    assert "ServiceAccount" not in objs
    assert objs["ClusterRoleBinding"]["subjects"][0] == {"kind": "ServiceAccount", "name": "existing-sa",
                                                         "namespace": "ops"}
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert [a for a in container["args"] if a.startswith("--namespace=")] == ["--namespace=team-a",
                                                                              "--namespace=team-b"]
    # A Role and RoleBinding in each watched namespace, to the chart's account in the release's.
    for ns in ("team-a", "team-b"):
        binding = objs[f"RoleBinding {ns}/{RELEASE}-inferasim-operator"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "existing-sa", "namespace": "ops"}]
    assert not [k for k in objs if k.startswith("Role ops/") and not k.endswith("-self")]
    assert container["image"] == "registry.example/inferasim-operator:1.2.3"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["INFERASIM_PRICE_CONFIGMAP"] == "gpu-prices"
    assert env["INFERASIM_PROMETHEUS_URL"] == "http://prometheus.monitoring:9090"
    # Helm merges maps: the NVIDIA defaults stay, AMD's ATOM falls back to the catalog's image.
    assert sorted(env["INFERASIM_ENGINE_IMAGES"].split(",")) == [
        "amd/sglang=reg/sglang-rocm:2", "amd/vllm=reg/vllm-rocm:2", "nvidia/sglang=lmsysorg/sglang:v0.5.17",
        "nvidia/vllm=vllm/vllm-openai:v0.27.1"]
    assert env["INFERASIM_STAGE2_TOP"] == "20" and env["INFERASIM_HARVESTER_IMAGE"] == "registry.example/harvester:9"
    mon = objs["ServiceMonitor"]
    assert mon["metadata"]["labels"]["release"] == "kube-prometheus"
    assert mon["spec"]["selector"]["matchLabels"].items() <= objs["Service"]["metadata"]["labels"].items()
    assert mon["spec"]["endpoints"][0]["port"] == objs["Service"]["spec"]["ports"][0]["name"]


# --------------------------------------------------------------------------------------------
# on the real API server
# --------------------------------------------------------------------------------------------


@pytest.fixture()
def installed(cluster: Any) -> Iterator[tuple[Any, str, list[dict[str, Any]]]]:
    """The default render created for real in a fresh namespace (what `helm install` sends; the
    CRDs are already there from the session), removed afterwards."""
    from kubernetes import client, utils

    ns = f"helm-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": ns}})
    # A release name unique to the test: ClusterRole names are cluster-wide.
    docs = render(namespace=ns)
    suffix = ns
    for d in docs:
        if d["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            d["metadata"]["name"] += f"-{suffix}"
        if d["kind"] == "ClusterRoleBinding":
            d["roleRef"]["name"] += f"-{suffix}"
    try:
        for d in docs:
            utils.create_from_dict(cluster.api, d, namespace=ns)
        yield cluster.api, ns, docs
    finally:
        rbac = client.RbacAuthorizationV1Api(cluster.api)
        for d in docs:
            try:
                if d["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(d["metadata"]["name"])
                elif d["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(d["metadata"]["name"])
            except client.ApiException:
                pass
        core.delete_namespace(ns)


@pytest.mark.e2e
def test_rendered_chart_is_accepted_and_its_account_is_least_privilege(
        installed: tuple[Any, str, list[dict[str, Any]]]) -> None:
    from kubernetes import client

    api, ns, docs = installed
    dep = by_kind(docs)["Deployment"]
    got = client.AppsV1Api(api).read_namespaced_deployment(dep["metadata"]["name"], ns)
    assert got.spec.template.spec.service_account_name == dep["spec"]["template"]["spec"]["serviceAccountName"]
    user = f"system:serviceaccount:{ns}:{dep['spec']['template']['spec']['serviceAccountName']}"

    def allowed(verb: str, resource: str, group: str = "", namespace: str = ns) -> bool:
        review = client.AuthorizationV1Api(api).create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
                     "resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                            "namespace": namespace}}})
        return bool(review.status.allowed)

    # What the operator does ...
    assert allowed("create", "jobs", "batch")
    assert allowed("patch", "servingtunings", "inferasim.io")
    assert allowed("patch", "servingtunings/status", "inferasim.io")
    assert allowed("create", "servinganchors", "inferasim.io", namespace="")
    assert allowed("create", "deployments", "apps")
    # ... and nothing it does not: no Secrets, no deleting tunings, no pods/exec, no RBAC escalation,
    # nothing written in a namespace it does not watch (test_rbac_least_privilege.py checks it all).
    assert not allowed("create", "jobs", "batch", namespace="default")
    assert not allowed("get", "secrets")
    assert not allowed("list", "secrets")
    assert not allowed("delete", "servingtunings", "inferasim.io")
    assert not allowed("create", "pods/exec")
    assert not allowed("create", "clusterrolebindings", "rbac.authorization.k8s.io", namespace="")
