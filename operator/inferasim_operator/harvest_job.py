"""What a harvest Job is: one `batch/v1` Job per missing anchor (kernel set + layout), and the way back.

The Job's pod runs the engine and the harvester side by side: the engine container serves the
model on the GPUs, the harvester container (the operator's image) waits for it, runs
`inferasim harvest run` against 127.0.0.1, writes the anchor into its termination message
(gzip + base64: the pod needs no API access and no Secret) and then tells the engine to stop
through a file in a shared emptyDir, so that the pod, and the Job, end. The operator reads the
message from the pod status and writes the ServingAnchor.

Names are deterministic (engine + kernel-set key + layout), so a restarted operator or a second
tuning that needs the same anchor finds the existing Job instead of starting another one.

Pure: manifests, limits and messages, no API calls (the harvester pod imports it too). Starting,
following and importing Jobs in the cluster is harvest.py.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any

from inferasim.catalog.engines import default_image, default_port
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.core.spec import HarvestPolicy
from inferasim.model.anchors import Anchor, KernelSet
from inferasim.model.memory import start_max_model_len
from inferasim.model.predictor import benchmark_kv_dtype
from inferasim.render import gpu_node_placement, render_deployment
from inferasim_operator.models import LABEL_ANCHOR, LABEL_KIND, LABEL_MANAGED, LABEL_TUNING, MANAGER, label_value
from inferasim_operator.pod_security import harden_pod

MESSAGE_PREFIX = "inferasim-anchor/v1:"
# The kubelet keeps at most 4096 bytes of a container's termination message.
MESSAGE_LIMIT = 4096
DONE_FILE = "/harvest/done"
ANCHOR_FILE = "/harvest/anchor.json"
HARVEST_CONTAINER = "harvester"
# The engine's start-up when `tune` did not estimate it (inferasim.harvest.plan.engine_startup_s
# does, from the weights each node loads).
ENGINE_STARTUP_S = 600.0


class MessageError(ValueError):
    """A termination message that does not hold an anchor."""


@dataclass(frozen=True)
class HarvestTarget:
    """One missing anchor: what `tune` reported, resolved to a kernel set."""

    engine: str
    model: str
    gpu: str
    precision: str
    layout: Layout
    gpu_hours: float
    startup_s: float = ENGINE_STARTUP_S  # engine start to healthy: weights loading and warm-up

    @classmethod
    def from_missing(cls, m: dict[str, Any]) -> HarvestTarget:
        lay = m["harvest_layout"]
        layout = Layout(tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1), moe_tp=lay.get("moe_tp", 0),
                        moe_ep=lay.get("moe_ep", 1))
        return cls(m["engine"], m["model"], m["gpu"], m["precision"], layout, float(m["harvest_gpu_hours"]),
                   float(m.get("harvest_startup_s") or ENGINE_STARTUP_S))

    @property
    def kernel_set(self) -> KernelSet:
        return KernelSet(engine=self.engine, model=self.model, gpu=self.gpu, precision=self.precision,
                         kv_dtype=benchmark_kv_dtype(self.precision))

    @property
    def key(self) -> str:
        """Hash of kernel set and layout: the anchor this harvest produces."""
        text = self.kernel_set._canonical_json() + "|" + self.layout.label()
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def job_name(self) -> str:
        return f"harvest-{self.engine}-{self.key}-{dns_label(self.layout.label())}"[:63].rstrip("-")


def dns_label(text: str) -> str:
    """``text`` lowercased with every run of other characters than [a-z0-9-] one dash: a name part
    Kubernetes accepts (Job, ServingAnchor and canary names are built from layout labels and ids)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


@dataclass(frozen=True)
class JobLimits:
    active_deadline_s: int
    backoff_limit: int
    budget_gpu_hours: float
    harvest_budget_s: int
    ready_timeout_s: int  # how long the harvester waits for the engine: what each try leaves after measuring


def job_limits(target: HarvestTarget, policy: HarvestPolicy, remaining_gpu_hours: float) -> JobLimits | None:
    """Deadline and retries that keep the Job within the GPU-hour budget; None when even one try
    does not fit. Each try costs about ``target.gpu_hours``; the deadline caps all tries together."""
    gpus = target.layout.gpus
    allowed = min(remaining_gpu_hours, policy.max_gpu_hours)
    if target.gpu_hours <= 0 or allowed + 1e-9 < target.gpu_hours:
        return None
    tries = max(1, min(3, int(math.floor(allowed / target.gpu_hours + 1e-9))))
    by_budget = allowed * 3600.0 / gpus
    deadline = int(min(policy.deadline_minutes * 60.0, by_budget))
    hours = deadline * gpus / 3600.0
    # The harvester's own wall-clock budget: what remains of one try after the engine starts; the
    # engine may take all the rest to start (a large model's weights load for many minutes).
    per_try = deadline / tries
    harvest_s = int(max(60.0, min(per_try - target.startup_s, per_try * 0.8)))
    return JobLimits(active_deadline_s=max(deadline, 60), backoff_limit=tries - 1, budget_gpu_hours=hours,
                     harvest_budget_s=harvest_s, ready_timeout_s=int(max(per_try - harvest_s, 60.0)))


def harvest_args(target: HarvestTarget, image: str, endpoint: str, budget_s: int, extra: list[str]) -> list[str]:
    """Arguments of `inferasim harvest run` for this target."""
    lay = target.layout
    args = ["--endpoint", endpoint, "--engine", target.engine, "--model", target.model, "--gpu", target.gpu,
            "--precision", target.precision, "--tp", str(lay.tp), "--pp", str(lay.pp), "--dp", str(lay.dp),
            "--ep", str(lay.moe_ep), "--engine-image", image, "--budget-s", str(budget_s), "--out", ANCHOR_FILE]
    return args + list(extra)


JOB_TTL_AFTER_FINISHED_S = 24 * 3600


def build_job(target: HarvestTarget, policy: HarvestPolicy, limits: JobLimits, *, namespace: str, tuning: str,
              harvester_image: str, extra_harvest_args: list[str] | None = None,
              engine_images: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
    """The Job manifest (owner references are added by the caller with kube.own). The engine
    image: the tuning's harvest.images, else the operator's per-vendor `engine_images` (chart value
    engineImages), else the catalog's image for the GPU."""
    gpu = get_gpu(target.gpu)
    image = (policy.images.get(target.engine) or (engine_images or {}).get((gpu.vendor, target.engine))
             or default_image(target.engine, gpu.vendor, gpu.name))
    kv_dtype = benchmark_kv_dtype(target.precision)
    # A KV pool shorter than the model's context: vLLM starts only with --max-model-len within it.
    max_len = start_max_model_len(get_model(target.model), gpu, target.layout, target.engine, target.precision,
                                  kv_dtype)
    cfg = ServingConfig(engine=target.engine, model=target.model, gpu=gpu.name, layout=target.layout,
                        precision=target.precision, kv_cache_dtype=kv_dtype, image=image, max_model_len=max_len)
    # The engine container exactly as a recommended Deployment would run it (flags, env, GPUs).
    pod_spec = render_deployment(cfg, "harvest", namespace)["spec"]["template"]["spec"]
    engine = pod_spec["containers"][0]
    argv = [*engine.pop("command"), *engine.pop("args")]
    port = default_port(target.engine)
    # Stop the engine once the harvester is done; the engine's own exit code otherwise.
    engine["command"] = ["/bin/sh", "-c",
                         f"{shlex.join(argv)} & pid=$!; "
                         f"while [ ! -e {DONE_FILE} ] && kill -0 $pid 2>/dev/null; do sleep 2; done; "
                         f"if [ -e {DONE_FILE} ]; then kill $pid 2>/dev/null; wait $pid; exit 0; fi; wait $pid"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        engine.pop(probe, None)  # the harvester waits for readiness itself; a restart would waste the try
    engine["volumeMounts"] = [*engine.get("volumeMounts", []), {"name": "harvest", "mountPath": "/harvest"}]
    endpoint = f"http://127.0.0.1:{port}"
    harvester = {
        "name": HARVEST_CONTAINER,
        "image": harvester_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "inferasim_operator.harvest_pod"],
        "args": ["--endpoint", endpoint, "--done-file", DONE_FILE, "--anchor-file", ANCHOR_FILE,
                 "--ready-timeout-s", str(limits.ready_timeout_s), "--",
                 *harvest_args(target, image, endpoint, limits.harvest_budget_s, extra_harvest_args or [])],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "harvest", "mountPath": "/harvest"}],
        "terminationMessagePolicy": "File",
    }
    # The spec's nodeSelector when it gives one, else the GPU's own placement (gpu_node_placement).
    placement = {"nodeSelector": dict(policy.node_selector)} if policy.node_selector else gpu_node_placement(gpu)
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in policy.tolerations] or [
        {"key": gpu.resource_name, "operator": "Exists", "effect": "NoSchedule"}]
    labels = {LABEL_MANAGED: MANAGER, LABEL_TUNING: label_value(tuning), LABEL_ANCHOR: target.key,
              LABEL_KIND: "harvest", "inferasim.io/engine": target.engine}
    pod_volumes = list(pod_spec["volumes"])
    template_spec = harden_pod({
        "restartPolicy": "Never",
        "containers": [engine, harvester],
        "volumes": [*pod_volumes, {"name": "harvest", "emptyDir": {}}],
        **placement,
        "tolerations": tolerations,
        "terminationGracePeriodSeconds": 30,
    }, non_root={HARVEST_CONTAINER})  # the pod talks to nothing but its own engine: no API token in it
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": target.job_name, "namespace": namespace, "labels": labels,
            "annotations": {"inferasim.io/kernel-set": target.kernel_set.describe(),
                            "inferasim.io/layout": target.layout.label(),
                            "inferasim.io/gpu-hours-budget": f"{limits.budget_gpu_hours:.3f}",
                            "inferasim.io/gpus": str(target.layout.gpus)},
        },
        "spec": {
            "activeDeadlineSeconds": limits.active_deadline_s,
            # A finished Job goes after a day: a failed one would otherwise block its anchor (one Job
            # per anchor, cluster-wide) for every tuning until someone deletes it; a day leaves the
            # operator ample time to import a succeeded one.
            "ttlSecondsAfterFinished": JOB_TTL_AFTER_FINISHED_S,
            "backoffLimit": limits.backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": template_spec},
        },
    }


# --------------------------------------------------------------------------------------------
# the anchor in a termination message
# --------------------------------------------------------------------------------------------


def encode_anchor(anchor: Anchor) -> str:
    """The termination message for ``anchor``; raises MessageError when even a slim form is too big.

    Step points are dropped first when needed: the fitted parameters and benchmark points are what
    predictions use."""
    for slim in (False, True):
        data = anchor.model_dump(mode="json", exclude_none=True)
        if slim:
            data["steps"] = []
            data["provenance"]["notes"] = (data["provenance"].get("notes", "") + " (step points dropped to fit the "
                                           "termination message)").strip()
            if not data.get("points"):
                break
        blob = base64.b64encode(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)).decode()
        message = MESSAGE_PREFIX + blob
        if len(message) <= MESSAGE_LIMIT:
            return message
    raise MessageError(f"the anchor does not fit a {MESSAGE_LIMIT}-byte termination message")


def decode_anchor(message: str) -> Anchor:
    if not message or not message.startswith(MESSAGE_PREFIX):
        raise MessageError("the harvester's termination message holds no anchor"
                           + (f" ({message[:200]!r})" if message else ""))
    try:
        data = json.loads(gzip.decompress(base64.b64decode(message[len(MESSAGE_PREFIX):].strip())))
    except (ValueError, OSError) as exc:
        raise MessageError(f"the termination message is corrupt: {exc}") from None
    try:
        return Anchor.model_validate(data)
    except ValueError as exc:
        raise MessageError(f"the harvested anchor is invalid: {exc}") from None


def anchor_object_name(anchor: Anchor) -> str:
    """ServingAnchor name: the anchor id (kernel-set key and layout label), DNS-safe."""
    return dns_label(anchor.id)[:253]


def anchor_object(anchor: Anchor, *, harvested_by: str = "", job: str = "") -> dict[str, Any]:
    from inferasim_operator.models import ANCHOR_KIND, API_VERSION

    return {
        "apiVersion": API_VERSION,
        "kind": ANCHOR_KIND,
        "metadata": {"name": anchor_object_name(anchor),
                     "labels": {LABEL_MANAGED: MANAGER, "inferasim.io/engine": anchor.kernel_set.engine,
                                "inferasim.io/kernel-set": anchor.kernel_set.key()},
                     "annotations": {"inferasim.io/harvested-by": harvested_by, "inferasim.io/job": job}},
        "spec": anchor.model_dump(mode="json", exclude_none=True),
    }


def terminated_message(pod: dict[str, Any], container: str = HARVEST_CONTAINER) -> str | None:
    """The termination message of ``container`` in a pod (dict form), if it terminated."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            term = (cs.get("state") or {}).get("terminated")
            if term:
                return term.get("message") or ""
    return None
