"""Fixtures of the end-to-end tests: a REAL control plane, the operator under the chart's RBAC.

Which cluster:
* INFERASIM_E2E_KUBECONFIG=path: any cluster (kind, a real one; `make e2e-kind`). The tests create
  namespaces, a fake GPU Node and cluster-scoped RBAC objects there, and remove them afterwards.
* otherwise a local Kubernetes v1.20.2 control plane from scripts/k8s (binaries cached outside the
  repository by scripts/k8s/build-k8s.sh), started for the session on 127.0.0.1 and stopped at the end.
Tests SKIP, saying why, only when neither is available.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inferasim_e2e_support import (  # noqa: E402
    OPERATOR_NS,
    OPERATOR_SA,
    REPO,
    ControlPlane,
    Prometheus,
    api_client,
    control_plane_missing,
    register_gpu_node,
    running_prometheus,
    service_account_kubeconfig,
    skip_or_fail,
    wait_until,
)

GPU_NODE = "inferasim-e2e-gpu-0"
GPU_PRODUCT = "AMD_Instinct_MI300X_OAM"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: needs a Kubernetes control plane (scripts/k8s, INFERASIM_E2E_KUBECONFIG)")
    config.addinivalue_line("markers", "integration: needs real external programs (prometheus)")


@dataclass
class Cluster:
    kubeconfig: Path
    api: Any
    local: bool
    start_s: float


def _apply_crds(api: Any) -> None:
    import yaml
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            ext.create_custom_resource_definition(crd)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            current = ext.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        for path in (REPO / "crds").glob("*.yaml"):
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            conds = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conds):
                return False
        return True

    wait_until(established, 60, "CRDs established")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = os.environ.get("INFERASIM_E2E_KUBECONFIG")
    if external:
        api = api_client(external)
        _apply_crds(api)
        yield Cluster(Path(external), api, local=False, start_s=0.0)
        return
    why = control_plane_missing()
    if why:
        skip_or_fail(why)
    cp = ControlPlane()
    try:
        cp.start(REPO / "crds")
        print(f"\ncontrol plane up in {cp.started_s:.1f} s ({cp.run_dir})")
        yield Cluster(cp.kubeconfig, api_client(cp.kubeconfig), local=True, start_s=cp.started_s)
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster) -> Iterator[Path]:
    """A kubeconfig for the chart's ServiceAccount, bound to the chart's ClusterRole (same rules; the
    namespaced Roles are granted per test namespace, inferasim_e2e_support.grant_namespace)."""
    from inferasim_operator.rbac import cluster_role
    from kubernetes import client

    core, rbac = client.CoreV1Api(cluster.api), client.RbacAuthorizationV1Api(cluster.api)
    role_name = f"inferasim-operator-e2e-{uuid.uuid4().hex[:6]}"
    for create, body in (
        (core.create_namespace, {"metadata": {"name": OPERATOR_NS}}),
    ):
        try:
            create(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    try:
        core.create_namespaced_service_account(OPERATOR_NS, {"metadata": {"name": OPERATOR_SA}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    role = cluster_role(role_name)
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]})
    out = Path(tempfile.mkdtemp(prefix="inferasim-sa-")) / "kubeconfig"
    try:
        yield service_account_kubeconfig(cluster.api, cluster.kubeconfig, OPERATOR_NS, OPERATOR_SA, out)
    finally:
        for fn in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                fn(role_name)
            except client.ApiException:
                pass


@pytest.fixture(scope="session")
def gpu_node(cluster: Cluster) -> Iterator[str]:
    """A registered Node with 8 amd.com/gpu and the ROCm labeller's product label."""
    from kubernetes import client

    register_gpu_node(cluster.api, GPU_NODE, {"amd.com/gpu.product-name": GPU_PRODUCT,
                                              "amd.com/gpu.device-id": "74a1", "amd.com/gpu.family": "AI"},
                      "amd.com/gpu", 8)
    yield GPU_NODE
    if not cluster.local:
        try:
            client.CoreV1Api(cluster.api).delete_node(GPU_NODE)
        except client.ApiException:
            pass


@pytest.fixture(scope="session")
def prometheus() -> Iterator[Prometheus]:
    with running_prometheus("inferasim-prom-") as p:
        yield p
