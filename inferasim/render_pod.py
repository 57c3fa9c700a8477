"""What a rendered engine pod needs beyond the engine's argv: the model cache on a PersistentVolumeClaim
with offline loading, ROCm and NVIDIA pod settings, RDMA for P/D's KV transfer, memory limits, and the
PodDisruptionBudget of a pool (issue 27 item 4).

:class:`RenderOptions` holds the user's choices (from ``spec.deploy`` or `inferasim render` flags);
:func:`apply_pod_options` edits a rendered pod template in place. Facts outside the notes cite their
public source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inferasim.core.engine_args import HF_HOME

if TYPE_CHECKING:  # pragma: no cover
    from inferasim.core.spec import DeploySpec

__all__ = ["KV_TRANSFER_BACKENDS", "RenderOptions", "apply_pod_options", "check_options", "model_cache_note",
           "render_pdb"]

# SGLang's P/D transfer engines a manifest renders (`--disaggregation-transfer-backend`; sgl-project/sglang
# docs/advanced_features/pd_disaggregation.md: "we support Mooncake and NIXL").
KV_TRANSFER_BACKENDS = ("mooncake", "nixl")

_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# An extended resource name: a domain prefix, '/', a name (rdma/hca_shared_devices_a, rdma/rdma_shared_device_a).
_EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

# ROCm containers: `docker run --device=/dev/kfd --device=/dev/dri --group-add video --security-opt
# seccomp=unconfined` (ROCm's "Running ROCm Docker containers" guide and vLLM's ROCm install docs). In a
# pod the ROCm device plugin (github.com/ROCm/k8s-device-plugin) injects /dev/kfd and the GPUs'
# /dev/dri/renderD* nodes for amd.com/gpu; the process still needs the groups that own them: video is GID
# 44 on Debian/Ubuntu (base-passwd). The render group's GID differs between hosts (109, 110, 992 ...), so
# it is an option (rocm_render_gid). The engine images run as root, which the groups do not restrict.
_VIDEO_GID = 44
_ROCM_ENV = {"HIP_FORCE_DEV_KERNARG": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class RenderOptions:
    """Manifest choices beyond the serving configuration. The defaults render what `inferasim render`
    always did (an emptyDir model cache), plus memory limits and a PodDisruptionBudget."""

    model_cache_pvc: str | None = None  # an existing ReadWriteMany/ReadOnlyMany claim holding HF_HOME
    offline: bool = False  # HF_HUB_OFFLINE=1: load from the cache only (needs model_cache_pvc)
    runtime_class_name: str | None = None  # NVIDIA: the RuntimeClass of the NVIDIA container runtime ("nvidia")
    rocm_render_gid: int | None = None  # AMD: the host's render group, added to the pod's groups
    rdma_resource: str | None = None  # P/D: an RDMA device-plugin resource requested per pod
    rdma_count: int = 1
    kv_transfer_backend: str = "mooncake"  # SGLang P/D: mooncake | nixl
    pod_disruption_budget: bool = True
    router_image: str | None = None  # P/D: the router's image (default: the engine's image)

    @classmethod
    def from_spec(cls, deploy: DeploySpec | None) -> RenderOptions:
        if deploy is None:
            return cls()
        return cls(model_cache_pvc=deploy.model_cache_pvc, offline=deploy.offline,
                   runtime_class_name=deploy.runtime_class_name, rocm_render_gid=deploy.rocm_render_gid,
                   rdma_resource=deploy.rdma_resource, rdma_count=deploy.rdma_count,
                   kv_transfer_backend=deploy.kv_transfer_backend, pod_disruption_budget=deploy.pod_disruption_budget,
                   router_image=deploy.router_image)


def check_options(o: RenderOptions, vendor: str | None = None) -> None:
    """ValueError naming the option and the fix; the CLI flags and the spec fields share these rules.
    ``vendor`` (amd | nvidia): also refuse an option that does nothing on that vendor's GPUs."""
    if vendor == "amd" and o.runtime_class_name:
        raise ValueError(f"runtime class {o.runtime_class_name!r} is an NVIDIA container runtime option; AMD "
                         "GPUs reach pods through the ROCm device plugin: drop it (--runtime-class, "
                         "deploy.runtimeClassName)")
    if vendor == "nvidia" and o.rocm_render_gid is not None:
        raise ValueError("the ROCm render group is for AMD GPUs: drop it (--rocm-render-gid, "
                         "deploy.rocmRenderGID)")
    if o.model_cache_pvc is not None and (len(o.model_cache_pvc) > 253 or not _DNS1123_SUBDOMAIN.match(
            o.model_cache_pvc)):
        raise ValueError(f"model cache PVC {o.model_cache_pvc!r} is not a PersistentVolumeClaim name (lower-case "
                         "letters, digits, '-' and '.', at most 253 characters)")
    if o.offline and not o.model_cache_pvc:
        raise ValueError("offline loading needs a model cache PVC that already holds the weights: give "
                         "--model-cache-pvc (spec deploy.modelCachePVC), or drop --offline")
    if o.runtime_class_name is not None and (len(o.runtime_class_name) > 253 or not _DNS1123_SUBDOMAIN.match(
            o.runtime_class_name)):
        raise ValueError(f"runtime class {o.runtime_class_name!r} is not a RuntimeClass name (e.g. nvidia)")
    if o.rdma_resource is not None and (len(o.rdma_resource) > 317 or not _EXTENDED_RESOURCE.match(
            o.rdma_resource)):
        raise ValueError(f"RDMA resource {o.rdma_resource!r} is not an extended resource name: give the "
                         "device plugin's resource, e.g. rdma/hca_shared_devices_a")
    if not 1 <= o.rdma_count <= 64:
        raise ValueError(f"RDMA count {o.rdma_count} must be between 1 and 64")
    if o.rocm_render_gid is not None and not 0 <= o.rocm_render_gid <= 2**31 - 1:
        raise ValueError(f"ROCm render group {o.rocm_render_gid} must be a GID (0 .. 2147483647)")
    if o.router_image is not None and (not o.router_image.strip() or len(o.router_image) > 512):
        raise ValueError("router image must be a non-empty image reference of at most 512 characters")
    if o.kv_transfer_backend not in KV_TRANSFER_BACKENDS:
        raise ValueError(f"KV transfer backend {o.kv_transfer_backend!r} is not one of "
                         f"{', '.join(KV_TRANSFER_BACKENDS)}")


def _env_set(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for e in env:
        if e.get("name") == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


def apply_pod_options(pod_spec: dict[str, Any], container: dict[str, Any], vendor: str, options: RenderOptions, *,
                      disaggregated: bool) -> None:
    """Edit a rendered engine pod (its spec and its engine container) in place."""
    check_options(options, vendor)
    resources = container["resources"]
    # Memory limit = request: a GPU pod is never the one the kernel should let grow into its neighbours'
    # memory (the /dev/shm emptyDir is counted in the container's memory, so the request already holds it).
    resources["limits"]["memory"] = resources["requests"]["memory"]

    if options.model_cache_pvc:
        for v in pod_spec["volumes"]:
            if v["name"] == "hf-cache":
                v.clear()
                # readOnly when offline: the pods only read what a loader Job (or a person) put there.
                v.update({"name": "hf-cache", "persistentVolumeClaim": {"claimName": options.model_cache_pvc,
                                                                        "readOnly": options.offline}})
        for m in container["volumeMounts"]:
            if m["name"] == "hf-cache" and options.offline:
                m["readOnly"] = True
    if options.offline:
        # huggingface_hub: HF_HUB_OFFLINE=1 makes no HTTP calls and serves files from HF_HOME's hub cache;
        # transformers honours TRANSFORMERS_OFFLINE (huggingface_hub and transformers "environment variables"
        # docs). A missing file then fails the start at once instead of downloading into the pod.
        _env_set(container, "HF_HUB_OFFLINE", "1")
        _env_set(container, "TRANSFORMERS_OFFLINE", "1")
        _env_set(container, "HF_DATASETS_OFFLINE", "1")

    sc = container.setdefault("securityContext", {})
    if vendor == "amd":
        # What vLLM's ROCm image bakes in (docker/Dockerfile.rocm; notes 5.1), for every engine's ROCm pod:
        # kernel arguments in device memory (lower launch latency on Instinct) and no tokenizer thread pool
        # fighting the server's own workers. A value the engine's env already set is kept.
        have = {e["name"] for e in container.get("env", [])}
        for name, value in _ROCM_ENV.items():
            if name not in have:
                _env_set(container, name, value)
        groups = [_VIDEO_GID] + ([options.rocm_render_gid] if options.rocm_render_gid is not None else [])
        pod_spec.setdefault("securityContext", {})["supplementalGroups"] = groups
        # seccomp=unconfined as ROCm's container guide runs them (the default profile blocks syscalls the
        # ROCm runtime's memory management uses on some kernels).
        sc["seccompProfile"] = {"type": "Unconfined"}
    elif options.runtime_class_name:
        # NVIDIA GPU Operator / container toolkit clusters that do not make nvidia the default runtime name
        # it in a RuntimeClass ("nvidia"), which the pod must then ask for.
        pod_spec["runtimeClassName"] = options.runtime_class_name
    if disaggregated:
        # KV transfer over RDMA (Mooncake, NIXL/UCX) registers (pins) GPU and host memory: IPC_LOCK lifts the
        # memlock limit (Mooncake's and UCX's RDMA docs; Kubernetes RDMA device plugin examples).
        sc.setdefault("capabilities", {}).setdefault("add", []).append("IPC_LOCK")
        if options.rdma_resource:
            for section in ("requests", "limits"):
                resources[section][options.rdma_resource] = str(options.rdma_count)
    if not sc:
        del container["securityContext"]


def render_pdb(name: str, namespace: str, selector: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    """policy/v1 PodDisruptionBudget: at most one pod of the pool evicted at a time (as the Deployment's
    rolling update replaces one at a time). A budget of zero would block node drains for good."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(selector)}},
    }


def model_cache_note(options: RenderOptions) -> str | None:
    """Where the weights come from, for an annotation."""
    if not options.model_cache_pvc:
        return None
    how = "offline (HF_HUB_OFFLINE=1, read-only)" if options.offline else "downloaded on first start, then reused"
    return f"PVC {options.model_cache_pvc} mounted at {HF_HOME} (HF_HOME): {how}"
