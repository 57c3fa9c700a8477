"""Every kind inferasim renders, created on a REAL API server with a server-side dry run: the API
server's own validation (names, ports, label selectors, resources, RBAC rules) on top of the offline
schema check of tests/unit/test_render_k8s.py. A server without policy/v1 (v1.20, the local control
plane) takes the PodDisruptionBudget as policy/v1beta1, whose spec has the same fields."""

from __future__ import annotations

import uuid

import pytest

from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.render import render_manifests
from inferasim.render_bench import BenchWorkload, render_bench_job
from inferasim.render_pd import render_pd_manifests
from inferasim.render_pod import RenderOptions

pytestmark = pytest.mark.e2e

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _rendered(ns: str) -> list[dict]:
    out = []
    for engine, gpu, opts in (("vllm", "H200", RenderOptions(runtime_class_name="nvidia", model_cache_pvc="models")),
                              ("sglang", "MI300X", RenderOptions(rdma_resource="rdma/hca_shared_devices_a",
                                                                 rocm_render_gid=110)),
                              ("atom", "MI355X", RenderOptions(model_cache_pvc="models", offline=True))):
        common = dict(engine=engine, model=MODEL, gpu=gpu)
        cfg = ServingConfig(layout=Layout(tp=2), replicas=2, **common)
        out += render_manifests(cfg, f"{engine}-c", ns, opts)
        out += render_pd_manifests(ServingConfig(layout=Layout(tp=1), disagg_role="prefill", **common),
                                   ServingConfig(layout=Layout(tp=2), disagg_role="decode", **common),
                                   f"{engine}-pd", ns, opts)
        out.append(render_bench_job(cfg, f"{engine}-c", f"{engine}-bench", BenchWorkload(1000, 100, 2.0, 200), ns,
                                    opts))
    return out


def test_the_api_server_accepts_every_rendered_object(cluster) -> None:
    from kubernetes import client, utils

    api = cluster.api
    ns = f"render-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": ns}})
    try:
        groups = {g.name: [v.version for v in g.versions] for g in client.ApisApi(api).get_api_versions().groups}
        rendered = _rendered(ns)
        assert {m["kind"] for m in rendered} == {"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount",
                                                 "Role", "RoleBinding", "Job"}
        for m in rendered:
            if m["kind"] == "PodDisruptionBudget" and "v1" not in groups.get("policy", []):
                # The Python client's typed APIs no longer hold policy/v1beta1: the dynamic client, dry run.
                from kubernetes.dynamic import DynamicClient

                pdbs = DynamicClient(api).resources.get(api_version="policy/v1beta1", kind="PodDisruptionBudget")
                pdbs.create(body={**m, "apiVersion": "policy/v1beta1"}, namespace=ns, dry_run="All")
                continue
            try:
                utils.create_from_dict(api, m, namespace=ns, dry_run="All")
            except utils.FailToCreateError as exc:  # pragma: no cover - the message is the point
                raise AssertionError(f"{m['kind']} {m['metadata']['name']}: "
                                     f"{[e.body for e in exc.api_exceptions]}") from None
    finally:
        client.CoreV1Api(api).delete_namespace(ns)
