"""Prefill/decode disaggregation as manifests: both pools and the engine's own P/D router (issue 27 item 3).

A P/D layout (P2xtp1+D2xtp1) deploys a prefill pool and a decode pool, each a Deployment of its own
layout running the engine's KV-transfer flags (:func:`inferasim.render.render_deployment` with
``disagg_role``), each behind a headless Service that names its HTTP and KV-transfer ports; and in front
of them the router clients talk to, behind a Service of the deployment's own name on the engine's port:

* vLLM: ``vllm-router --vllm-pd-disaggregation`` (vllm-project/router; the NixlConnector protocol is its
  default ``--kv-connector nixl``), finding the pools' pods by label (``--service-discovery
  --prefill-selector/--decode-selector``). The router is a PyPI wheel, not part of the vllm-openai image:
  without ``router_image`` the container installs it (``pip install vllm-router==0.1.17``) at start,
  which an offline deployment cannot (it is refused there, naming ``router_image``).
* SGLang: ``python3 -m sglang_router.launch_router --pd-disaggregation`` with the same discovery flags
  (sgl-project/sglang router docs), reading each prefill pod's bootstrap port from its annotation
  ``sglang.ai/bootstrap-port``. sglang-router ships in SGLang's images.
* ATOM: ``atomesh launch --pd-disaggregation --backend atom`` as ATOM's P/D recipes run it, with static
  ``--prefill URL HANDSHAKE_PORT`` / ``--decode URL`` only (no Kubernetes discovery is documented): it is
  rendered for one prefill and one decode pod, which the pools' headless Services name; for more pods
  :func:`pd_router_gap` says why no router is rendered.

Discovering routers get a ServiceAccount with a Role that reads pods in the namespace (their pod watch).
"""

from __future__ import annotations

from typing import Any

from inferasim.catalog.engines import default_port
from inferasim.core.config import ServingConfig
from inferasim.render import (
    ANNOTATION_PD_ROUTER,
    ATOM_HANDSHAKE_PORT,
    LABEL_ENGINE,
    LABEL_NAME,
    PD_ROUTER,
    check_k8s_names,
    image_of,
    kv_transfer_ports,
    render_deployment,
)
from inferasim.render_pod import RenderOptions, check_options, render_pdb

__all__ = ["VLLM_ROUTER_VERSION", "pd_router_gap", "render_pd_manifests", "router_args"]

# vllm-router on PyPI (vllm-project/router's wheel); pinned so a pod restart runs the router it was given.
VLLM_ROUTER_VERSION = "0.1.17"
_ROUTER_CPU = "2"
_ROUTER_MEMORY = "4Gi"
_MAX_BASE_NAME = 63 - len("-prefill")  # every object name stays a DNS-1035 label


def pd_router_gap(engine: str, prefill_pods: int, decode_pods: int) -> str | None:
    """Why no P/D router is rendered for this engine and pool size; None when one is."""
    if engine == "atom" and (prefill_pods > 1 or decode_pods > 1):
        return (f"ATOM's atomesh takes static --prefill/--decode URLs (no Kubernetes pod discovery in ATOM's "
                f"recipes): with {prefill_pods} prefill and {decode_pods} decode pods no router is rendered; "
                "start atomesh with one --prefill URL 6301 per prefill pod and one --decode URL per decode pod")
    return None


def _selector(name: str) -> str:
    return f"{LABEL_NAME}={name}"


def router_args(engine: str, name: str, namespace: str) -> tuple[list[str], list[str]]:
    """(command, args) of the P/D router in front of ``name``-prefill and ``name``-decode."""
    port = str(default_port(engine))
    pre, dec = f"{name}-prefill", f"{name}-decode"
    listen = ["--host", "0.0.0.0", "--port", port]
    discovery = ["--service-discovery", "--service-discovery-namespace", namespace,
                 "--service-discovery-port", port,
                 "--prefill-selector", _selector(pre), "--decode-selector", _selector(dec)]
    if engine == "vllm":
        return ["vllm-router"], ["--vllm-pd-disaggregation", *discovery, *listen]
    if engine == "sglang":
        return ["python3", "-m", "sglang_router.launch_router"], ["--pd-disaggregation", *discovery, *listen]
    # Headless Services: each name resolves to its pool's one pod (pd_router_gap refuses more).
    return ["atomesh"], ["launch", *listen, "--pd-disaggregation",
                         "--prefill", f"http://{pre}.{namespace}.svc:{port}", str(ATOM_HANDSHAKE_PORT),
                         "--decode", f"http://{dec}.{namespace}.svc:{port}", "--backend", "atom"]


def _labels(name: str, engine: str, component: str) -> dict[str, str]:
    return {LABEL_NAME: name, "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "inferasim", LABEL_ENGINE: engine}


def _pool_service(cfg: ServingConfig, name: str, namespace: str) -> dict[str, Any]:
    """Headless Service of a pool: per-pod DNS records, the HTTP and KV-transfer ports named."""
    ports = [{"name": "http", "port": default_port(cfg.engine), "targetPort": "http", "protocol": "TCP"}]
    ports += [{"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
              for p in kv_transfer_ports(cfg)]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels(name, cfg.engine, cfg.disagg_role
                                                                                  or "pool")},
            "spec": {"clusterIP": "None", "selector": {LABEL_NAME: name}, "ports": ports}}


def _rbac(name: str, namespace: str, engine: str) -> list[dict[str, Any]]:
    labels = _labels(name, engine, "pd-router")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace,
                                                                    "labels": labels}},
        # The routers' discovery watches pods by label selector in one namespace: get, list, watch.
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


def _router_deployment(cfg: ServingConfig, name: str, router: str, namespace: str,
                       options: RenderOptions) -> dict[str, Any]:
    engine = cfg.engine
    port = default_port(engine)
    command, args = router_args(engine, name, namespace)
    image = options.router_image or image_of(cfg, cfg.gpu_spec)
    if engine == "vllm" and not options.router_image:
        if options.offline:
            raise ValueError("the vLLM P/D router installs vllm-router from PyPI when it starts, which an offline "
                             "cluster cannot: give an image that has vllm-router (--router-image, deploy.routerImage)")
        # The engine image has Python and pip but not the router: install the pinned wheel, then run it.
        command, args = (["sh", "-c", f"pip install --no-cache-dir vllm-router=={VLLM_ROUTER_VERSION} && "
                                      'exec vllm-router "$@"', "vllm-router"], args)
    labels = _labels(router, engine, "pd-router")
    pod: dict[str, Any] = {
        "containers": [{
            "name": "router", "image": image, "imagePullPolicy": "IfNotPresent", "command": command, "args": args,
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": _ROUTER_CPU, "memory": _ROUTER_MEMORY},
                          "limits": {"cpu": _ROUTER_CPU, "memory": _ROUTER_MEMORY}},
            # A TCP check: the three routers' HTTP health paths differ between releases.
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 10, "failureThreshold": 3},
            "livenessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 30, "failureThreshold": 5},
        }],
        "terminationGracePeriodSeconds": 30,
    }
    if engine != "atom":
        pod["serviceAccountName"] = router
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": router, "namespace": namespace, "labels": labels,
                     "annotations": {ANNOTATION_PD_ROUTER: PD_ROUTER[engine]}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {LABEL_NAME: router}},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }


def render_pd_manifests(prefill: ServingConfig, decode: ServingConfig, name: str, namespace: str = "default",
                        options: RenderOptions | None = None) -> list[dict[str, Any]]:
    """Everything that serves one P/D deployment: the router (RBAC, Deployment ``name``-router, Service
    ``name`` on the engine's port, which clients use), the prefill and decode Deployments with their
    headless Services, and a PodDisruptionBudget per Deployment (unless the options turn them off)."""
    opts = options or RenderOptions()
    check_options(opts)
    check_k8s_names(name, namespace)
    if len(name) > _MAX_BASE_NAME:
        raise ValueError(f"name={name!r}: a P/D deployment names its objects NAME-prefill, NAME-decode and "
                         f"NAME-router, so NAME must be at most {_MAX_BASE_NAME} characters")
    if prefill.disagg_role != "prefill" or decode.disagg_role != "decode":
        raise ValueError(f"P/D pools need disagg_role prefill and decode, got {prefill.disagg_role!r} and "
                         f"{decode.disagg_role!r}")
    for field in ("engine", "model", "gpu"):
        if getattr(prefill, field) != getattr(decode, field):
            raise ValueError(f"the prefill and decode pools differ in {field} ({getattr(prefill, field)!r} vs "
                             f"{getattr(decode, field)!r}); KV moves only between pools of one engine and model")
    engine = prefill.engine
    router = f"{name}-router"
    out: list[dict[str, Any]] = []
    gap = pd_router_gap(engine, prefill.replicas, decode.replicas)
    if gap is None:
        if engine != "atom":
            out += _rbac(router, namespace, engine)
        out.append(_router_deployment(prefill, name, router, namespace, opts))
        out.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": namespace, "labels": _labels(name, engine, "pd-router")},
                    "spec": {"type": "ClusterIP", "selector": {LABEL_NAME: router},
                             "ports": [{"name": "http", "port": default_port(engine), "targetPort": "http",
                                        "protocol": "TCP"}]}})
    for cfg in (prefill, decode):
        pool = f"{name}-{cfg.disagg_role}"
        dep = render_deployment(cfg, pool, namespace, options=opts)
        dep["metadata"]["annotations"][ANNOTATION_PD_ROUTER] = (
            gap or f"the {cfg.disagg_role} half of each request; clients reach it through Service {name} (the P/D "
                   f"router Deployment {router}: {PD_ROUTER[engine]})")
        out += [dep, _pool_service(cfg, pool, namespace)]
    if opts.pod_disruption_budget:
        for d in [m for m in out if m["kind"] == "Deployment"]:
            n = d["metadata"]["name"]
            out.append(render_pdb(n, namespace, {LABEL_NAME: n}, {LABEL_NAME: n,
                                                                  "app.kubernetes.io/managed-by": "inferasim"}))
    return out
