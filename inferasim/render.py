"""Render a serving configuration as Kubernetes manifests (plain dicts, YAML-dumpable).

One :class:`~inferasim.core.config.ServingConfig` (engine, model, GPU, layout, scheduler and memory knobs) becomes an
``apps/v1`` Deployment running the engine's OpenAI-compatible server plus a ClusterIP Service on
its HTTP port. The library never imports ``kubernetes`` or ``kopf``: the operator applies the
dicts, the CLI prints them with :func:`to_yaml`.

The engine's argv and environment come from :mod:`inferasim.core.engine_args`, the configuration
from :mod:`inferasim.core.config`. Source tags in the comments are those of
``shared/notes/engine-facts.md`` section 0 (``K``/``N``: AMD / NVIDIA device-plugin node labels,
section 6); facts read outside the notes say so ("not in the notes").

Scope: one replica must fit on one node (``layout.gpus <= gpus_per_node``). Multi-node replicas
need LeaderWorkerSet or Ray and are refused with a ValueError. For P/D disaggregation
(``disagg_role``) this renders one pool with its KV-transfer flags and ports; the prefill and decode
pools together with the engine's P/D router in front of them are rendered by :mod:`inferasim.render_pd`.
Pod settings beyond the engine (model cache PVC, ROCm / NVIDIA pod settings, RDMA, memory limits, the
PodDisruptionBudget) come from :class:`inferasim.render_pod.RenderOptions`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from inferasim.catalog.checkpoints import precision_error
from inferasim.catalog.engines import default_image, default_port, launch_command
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import get_model
from inferasim.core.config import ServingConfig
from inferasim.core.engine_args import HF_HOME, engine_args, engine_env, nodes_of, online_fp8
from inferasim.render_pod import RenderOptions, apply_pod_options, model_cache_note, render_pdb

__all__ = [
    "ANNOTATION_FP8_KERNELS",
    "ANNOTATION_MODEL_CACHE",
    "ANNOTATION_PD_ROUTER",
    "LABEL_ENGINE",
    "LABEL_LAYOUT",
    "LABEL_NAME",
    "PD_ROUTER",
    "RENDERED_PD_DEFAULTS",
    "gpu_node_label",
    "gpu_node_placement",
    "kv_transfer_ports",
    "fp8_kernels_note",
    "served_model_id",
    "render_deployment",
    "render_manifests",
    "render_service",
    "to_yaml",
]

LABEL_NAME = "app.kubernetes.io/name"
LABEL_ENGINE = "inferasim.io/engine"
LABEL_LAYOUT = "inferasim.io/layout"
LABEL_ROLE = "inferasim.io/disagg-role"
LABEL_GPU = "inferasim.io/gpu"

# Node label that carries the GPU product (notes section 6): K amd.com/gpu.product-name written by
# the ROCm node labeller, N nvidia.com/gpu.product written by GPU feature discovery.
PRODUCT_LABEL_KEY: dict[str, str] = {
    "amd": "amd.com/gpu.product-name",
    "nvidia": "nvidia.com/gpu.product",
}
HF_TOKEN_SECRET = "hf-token"  # optional Secret (key "token") for gated models

# Sizing heuristics (not from the notes): host resources requested per GPU of the replica, and the
# /dev/shm size (NCCL/RCCL and the engines' multiprocess workers use shared memory; the engines'
# docs run their containers with --shm-size 16g-32g).
_CPU_PER_GPU = 4
_MEMORY_GIB_PER_GPU = 32
_SHM_GIB_SINGLE_GPU = 16
_SHM_GIB_MULTI_GPU = 32

# Probes: weights download + load + graph capture of a large model can take many minutes, so a
# startup probe (up to 30 min) guards the liveness probe.
_PROBE_PATH = "/health"  # vLLM / ATOM: notes 5.1 and 5.3; SGLang http_server /health (not in the notes)

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VERSION_TAG = re.compile(r"^v\d+(\.\d+)*")


# Annotation of a manifest whose online FP8 runs other kernels than the price assumed.
ANNOTATION_FP8_KERNELS = "inferasim.io/fp8-kernels"
# Annotation of a P/D pool: which router clients reach it through (render_pd renders it with both pools).
ANNOTATION_PD_ROUTER = "inferasim.io/pd-router"
ANNOTATION_MODEL_CACHE = "inferasim.io/model-cache"
PD_ROUTER = {
    "vllm": "vllm-router --vllm-pd-disaggregation",  # vllm-project/router (README), not in the notes
    "sglang": "python3 -m sglang_router.launch_router --pd-disaggregation",  # sgl-project/sglang router docs
    "atom": "atomesh launch --pd-disaggregation",  # ROCm/ATOM P/D recipes, not in the notes
}
# KV-transfer ports of a P/D pod (not in the notes): vLLM's NixlConnector handshake side channel
# (VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600, vllm/envs.py); SGLang's prefill bootstrap server
# (--disaggregation-bootstrap-port, default 8998, server_args.py), which the router hands to decode;
# ATOM's mooncake handshake port (kv-transfer-config handshake_port, 6301 in its recipes). The bulk KV
# bytes move over RDMA queue pairs, which use no TCP port.
VLLM_NIXL_SIDE_CHANNEL_PORT = 5600
SGLANG_BOOTSTRAP_PORT = 8998
ATOM_HANDSHAKE_PORT = 6301
# The P/D flags render_deployment adds on its own for SGLang, with their default values: a reader of a
# rendered manifest (inferasim.deployment) takes them for the renderer's, not for extra_args.
RENDERED_PD_DEFAULTS: dict[tuple[str, str], str] = {
    ("sglang", "--disaggregation-transfer-backend"): RenderOptions.kv_transfer_backend,
    ("sglang", "--disaggregation-bootstrap-port"): str(SGLANG_BOOTSTRAP_PORT),
}


def kv_transfer_ports(cfg: ServingConfig) -> list[dict[str, Any]]:
    """Container ports of ``cfg``'s KV transfer (none for a colocated pool, or for SGLang's decode side,
    which connects out to the prefill side's bootstrap port)."""
    if not cfg.disagg_role:
        return []
    if cfg.engine == "vllm":
        return [{"name": "nixl-side", "containerPort": VLLM_NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}]
    if cfg.engine == "sglang":
        return ([{"name": "bootstrap", "containerPort": SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"}]
                if cfg.disagg_role == "prefill" else [])
    return [{"name": "kv-handshake", "containerPort": ATOM_HANDSHAKE_PORT, "protocol": "TCP"}]


def fp8_kernels_note(cfg: ServingConfig) -> str | None:
    """What to know when ``cfg`` quantizes a 16-bit checkpoint online to FP8 (per tensor) while the
    predictor prices the model's family at block-scaled FP8 (catalog.models.FP8_BLOCK_FAMILIES: the
    kernels of its published FP8 checkpoint, which measured data cover). None when they agree."""
    if not online_fp8(cfg):
        return None
    try:
        model = get_model(cfg.model)
    except (ValueError, OSError):  # ModelConfigError and unknown names are ValueErrors
        return None  # a model the catalog does not know: nothing was priced from its family
    if model.fp8_scales != "block" or model.checkpoint_format not in ("bf16", "fp16"):
        return None  # an FP8 checkpoint brings its own scales, which the price follows
    return ("priced as block-scaled FP8, the kernels of this family's published FP8 checkpoint; "
            "--quantization fp8 scales per tensor and prefills faster than priced (TTFT below the "
            "prediction). Point the model at the published FP8 checkpoint to run the priced kernels.")


def served_model_id(model: str, spec_name: str) -> str:
    """The id a manifest serves for a model the user named ``model`` (``spec_name``: the catalog's
    name for it): the user's own id, which may be a variant the catalog only prices by its base
    (an -Instruct or another org's -FP8); for a config.json path, the Hugging Face id its file
    name spells (``org--name_config.json``). ValueError when a path names none: a pod downloads
    an id, not a local file."""
    if not (model.endswith(".json") or Path(model).is_dir()):
        return model
    if "/" in spec_name and not spec_name.startswith(("/", ".")):
        return spec_name
    raise ValueError(f"model {model!r} is a config.json path that names no Hugging Face id; a manifest needs "
                     "the id the pod downloads: give model as that id (org/name)")


# --------------------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------------------


def gpu_node_label(gpu: GPU) -> tuple[str, str]:
    """(label key, value) that selects nodes with ``gpu`` (notes section 6, K / N)."""
    return PRODUCT_LABEL_KEY[gpu.vendor], gpu.product_label


# amd.com/gpu.device-id values of the ROCm node labeller per GPU (notes section 6, K, and the
# device names of vLLM's rocm.py: 0x7408 MI250X, 0x740c MI250X or MI250 (one id for both: read back
# as MI250, which comes later), 0x74a1/0x74b5 MI300X, 0x74a5/0x74b9 MI325X, 0x75a0 MI350X, 0x75a3
# MI355X). Rendering selects by them; deployment.read_deployment reads them back.
AMD_DEVICE_IDS: dict[str, tuple[str, ...]] = {"MI250X": ("7408", "740c"), "MI250": ("740c",),
                                              "MI300X": ("74a1", "74b5"), "MI325X": ("74a5", "74b9"),
                                              "MI350X": ("75a0",), "MI355X": ("75a3",)}


def gpu_node_placement(gpu: GPU) -> dict[str, Any]:
    """The pod-spec fields that put a pod on nodes with ``gpu``. NVIDIA: a nodeSelector on GPU
    feature discovery's product label. AMD: a required node affinity matching the product name OR
    the device id: the ROCm device plugin's labeller emits amd.com/gpu.product-name only when
    started with -product-name, which its own DaemonSet and Helm chart do not pass, while
    -device-id is on by default (notes section 6)."""
    key, value = gpu_node_label(gpu)
    ids = AMD_DEVICE_IDS.get(gpu.name) if gpu.vendor == "amd" else None
    if not ids:
        return {"nodeSelector": {key: value}}
    terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]},
             {"matchExpressions": [{"key": "amd.com/gpu.device-id", "operator": "In", "values": list(ids)}]}]
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}}


def check_k8s_names(name: str, namespace: str) -> None:
    if not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(
            f"name={name!r} must be a DNS-1035 label (lower-case letters, digits and '-', starting with a "
            "letter, at most 63 characters): it names the Deployment and the Service"
        )
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        raise ValueError(f"namespace={namespace!r} must be a DNS-1123 label")


def image_of(cfg: ServingConfig, gpu: GPU) -> str:
    if cfg.image:
        return cfg.image
    image = default_image(cfg.engine, gpu.vendor, gpu.name)  # notes section 6 (tags seen in I)
    version = cfg.engine_version.strip().lstrip("v") if cfg.engine_version else ""
    if not version:
        return image
    repo, _, tag = image.rpartition(":")
    if cfg.engine in ("vllm", "sglang") and _VERSION_TAG.match(tag):
        # vllm/vllm-openai[-rocm]:vX.Y.Z, lmsysorg/sglang:vX.Y.Z[-rocm720-mi3Nx] (section 6)
        return repo + ":" + _VERSION_TAG.sub("v" + version, tag)
    if version in tag:
        return image
    raise ValueError(
        f"engine_version={cfg.engine_version!r}: no image tag can be derived for {cfg.engine} on {gpu.name} "
        f"(default image {image}); set image explicitly"
    )


def _labels(cfg: ServingConfig, name: str, extra: dict[str, str] | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for k, v in (extra or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"labels must map strings to strings, got {k!r}: {v!r}")
        labels[k] = v
    labels.update(
        {
            LABEL_NAME: name,
            "app.kubernetes.io/component": cfg.disagg_role or "inference-server",
            "app.kubernetes.io/managed-by": "inferasim",
            LABEL_ENGINE: cfg.engine,
            LABEL_LAYOUT: cfg.layout.label(),
            LABEL_GPU: cfg.gpu_spec.name,
        }
    )
    if cfg.disagg_role:
        labels[LABEL_ROLE] = cfg.disagg_role
    return labels


def _probe(port: int, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": _PROBE_PATH, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def render_deployment(
    cfg: ServingConfig,
    name: str,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    *,
    hf_token_secret: str | None = HF_TOKEN_SECRET,
    options: RenderOptions | None = None,
    node_role: str | None = None,
) -> dict[str, Any]:
    """``apps/v1`` Deployment serving ``cfg`` (one pod per replica, all GPUs of a replica in one pod).

    ``hf_token_secret`` names an optional Secret whose key ``token`` becomes ``HF_TOKEN`` (gated
    models); the pod starts without it. Raises ValueError when a replica needs more GPUs than one
    node holds (multi-node serving needs LeaderWorkerSet / Ray and is not rendered), and when the
    engine would not run the precision asked for with this checkpoint (precision_error).

    ``node_role`` ("leader" | "worker"): the pod of one node of a multi-node replica, for
    render_leader_worker_set (the engine's multi-node flags; a worker serves no HTTP, so it has no
    port and no probes).
    """
    check_k8s_names(name, namespace)
    why = precision_error(cfg.engine, cfg.model, cfg.precision)
    if why:
        raise ValueError(why)
    gpu = cfg.gpu_spec
    argv = engine_args(cfg, node_role)  # also checks the node fit and every flag
    n_launch = len(launch_command(cfg.engine))
    port = default_port(cfg.engine)
    gpus = cfg.gpus_per_replica if node_role is None else cfg.gpus_per_replica // nodes_of(cfg)
    shm_gib = _SHM_GIB_SINGLE_GPU if gpus == 1 else _SHM_GIB_MULTI_GPU
    all_labels = _labels(cfg, name, labels)

    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in engine_env(cfg).items()]
    if hf_token_secret:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": hf_token_secret, "key": "token", "optional": True}},
            }
        )
    if cfg.engine == "vllm" and cfg.disagg_role:
        # vLLM NixlConnector side channel binds VLLM_NIXL_SIDE_CHANNEL_HOST (default localhost; vllm/envs.py,
        # not in the notes): the pod IP lets the other pool reach it.
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(VLLM_NIXL_SIDE_CHANNEL_PORT)})
    opts = options or RenderOptions()
    engine_argv = argv[n_launch:]
    if cfg.engine == "sglang" and cfg.disagg_role:
        # The transfer engine (mooncake | nixl) and, on prefill, the bootstrap port the container exposes
        # (sgl-project/sglang docs/advanced_features/pd_disaggregation.md); extra_args may set them instead.
        given = {t.split("=", 1)[0] for t in cfg.extra_args}
        if "--disaggregation-transfer-backend" not in given:
            engine_argv += ["--disaggregation-transfer-backend", opts.kv_transfer_backend]
        if cfg.disagg_role == "prefill" and "--disaggregation-bootstrap-port" not in given:
            engine_argv += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]

    container: dict[str, Any] = {
        "name": cfg.engine,
        "image": image_of(cfg, gpu),
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:n_launch],
        "args": engine_argv,
        "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}, *kv_transfer_ports(cfg)],
        "resources": {
            "requests": {
                gpu.resource_name: str(gpus),
                "cpu": str(_CPU_PER_GPU * gpus),
                "memory": f"{_MEMORY_GIB_PER_GPU * gpus + shm_gib}Gi",
            },
            "limits": {gpu.resource_name: str(gpus)},
        },
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "hf-cache", "mountPath": HF_HOME},
        ],
        "startupProbe": _probe(port, period=10, failures=180, timeout=5),
        "readinessProbe": _probe(port, period=10, failures=3, timeout=5),
        "livenessProbe": _probe(port, period=30, failures=5, timeout=10),
    }
    annotations = {
        "inferasim.io/model": cfg.model,
        "inferasim.io/precision": cfg.precision,
        "inferasim.io/gpus-per-replica": str(gpus),
    }
    if cfg.engine_version:
        annotations["inferasim.io/engine-version"] = cfg.engine_version
    note = fp8_kernels_note(cfg)
    if note:
        annotations[ANNOTATION_FP8_KERNELS] = note
    if cfg.disagg_role:
        annotations[ANNOTATION_PD_ROUTER] = (
            f"this pool runs the {cfg.disagg_role} half of each request; clients go to a P/D router in front of "
            f"the prefill and decode pools ({PD_ROUTER[cfg.engine]}); render both pools together (inferasim render "
            "--pd, tune --manifest) to get it")
    cache_note = model_cache_note(opts)
    if cache_note:
        annotations[ANNOTATION_MODEL_CACHE] = cache_note
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(all_labels), "annotations": annotations},
        "spec": {
            "replicas": cfg.replicas,
            "selector": {"matchLabels": {LABEL_NAME: name}},
            # GPUs are scarce: replace pods one at a time instead of surging extra GPU pods.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": dict(all_labels), "annotations": pod_annotations},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}},
                        {"name": "hf-cache", "emptyDir": {}},
                    ],
                    **gpu_node_placement(gpu),
                    "tolerations": [{"key": gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 60,
                },
            },
        },
    }
    pod_spec = deployment["spec"]["template"]["spec"]
    apply_pod_options(pod_spec, pod_spec["containers"][0], gpu.vendor, opts, disaggregated=bool(cfg.disagg_role))
    if node_role == "worker":
        for key in ("startupProbe", "readinessProbe", "livenessProbe"):
            del container[key]
        container["ports"] = [p for p in container["ports"] if p["name"] != "http"]
        if not container["ports"]:
            del container["ports"]
        del deployment["spec"]["template"]["metadata"]["annotations"]  # no /metrics to scrape
    if cfg.engine == "sglang" and cfg.disagg_role == "prefill":
        # sglang_router's Kubernetes discovery reads a prefill pod's bootstrap port from this annotation
        # (--bootstrap-port-annotation, default sglang.ai/bootstrap-port; sglang router docs).
        deployment["spec"]["template"]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] = \
            str(SGLANG_BOOTSTRAP_PORT)
    return deployment


def render_service(cfg: ServingConfig, name: str, namespace: str = "default",
                   selector: dict[str, str] | None = None) -> dict[str, Any]:
    """ClusterIP Service on the engine's HTTP port (port name ``http``, for a ServiceMonitor on /metrics);
    ``selector``: the pods it sends to (default: every pod named ``name``)."""
    check_k8s_names(name, namespace)
    port = default_port(cfg.engine)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_NAME: name, LABEL_ENGINE: cfg.engine, "app.kubernetes.io/managed-by": "inferasim"},
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector or {LABEL_NAME: name},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


# A multi-node replica's pods: "leader" (node rank 0, the HTTP server) or "worker".
LABEL_NODE_ROLE = "inferasim.io/node-role"


def render_leader_worker_set(cfg: ServingConfig, name: str, namespace: str = "default",
                             options: RenderOptions | None = None) -> dict[str, Any]:
    """``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet serving ``cfg`` when a replica spans nodes: one
    group of ``nodes`` pods per replica, each pod all GPUs of its node; the leader (node rank 0)
    serves HTTP, the workers join its engine (kubernetes-sigs/lws; needs the LWS controller)."""
    nodes = nodes_of(cfg)
    if nodes < 2:
        raise ValueError(f"layout {cfg.layout.label()} fits one node: render it as a Deployment")
    leader = render_deployment(cfg, name, namespace, options=options, node_role="leader")
    worker = render_deployment(cfg, name, namespace, options=options, node_role="worker")
    templates = []
    for role, d in (("leader", leader), ("worker", worker)):
        t = d["spec"]["template"]
        t["metadata"]["labels"][LABEL_NODE_ROLE] = role
        templates.append(t)
    leader["metadata"]["annotations"]["inferasim.io/nodes-per-replica"] = str(nodes)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": leader["metadata"],
        "spec": {
            "replicas": cfg.replicas,
            "leaderWorkerTemplate": {
                "size": nodes,
                # One engine spans the group: a pod that restarts leaves the others' ranks waiting
                # on a peer that is gone, so the group restarts together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": templates[0],
                "workerTemplate": templates[1],
            },
        },
    }


def render_manifests(cfg: ServingConfig, name: str, namespace: str = "default",
                     options: RenderOptions | None = None) -> list[dict[str, Any]]:
    """``[Deployment, Service, PodDisruptionBudget]`` for ``cfg`` (the budget unless options turn it off);
    a replica larger than one node is a LeaderWorkerSet whose Service sends to the leaders."""
    opts = options or RenderOptions()
    if nodes_of(cfg) > 1:
        out = [render_leader_worker_set(cfg, name, namespace, opts),
               render_service(cfg, name, namespace, {LABEL_NAME: name, LABEL_NODE_ROLE: "leader"})]
    else:
        out = [render_deployment(cfg, name, namespace, options=opts), render_service(cfg, name, namespace)]
    if opts.pod_disruption_budget:
        out.append(render_pdb(name, namespace, {LABEL_NAME: name}, out[1]["metadata"]["labels"]))
    return out


def to_yaml(manifests: list[dict[str, Any]]) -> str:
    """Multi-document YAML (``---`` separated), keys in rendering order."""
    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False, width=4096)
