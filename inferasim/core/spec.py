"""The tuning specification: what `inferasim tune SPEC.yaml` reads and what the ServingTuning
custom resource's `spec` holds. One set of pydantic models is the single source of both (the
operator generates its CRD schema from these).

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python; both are
accepted on input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from inferasim.catalog.engines import ENGINES
from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.catalog.precision import normalize_precision
from inferasim.catalog.userfile import UserFileError, load_yaml, read_user_text
from inferasim.errors import UserError


class _Model(BaseModel):
    # No inf or nan anywhere in a spec (YAML spells them .inf and .nan): a number that no JSON
    # carries ends up in the operator's status patch, which the API server then refuses whole.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", allow_inf_nan=False)


# Bounds of the spec's fields. The CRD schema is generated from these models, so the API server
# refuses what exceeds them before the operator reads it; each is far beyond any real deployment
# and far below what would make the operator's searches, URLs, names or status patches fail.
MAX_NAME = 253  # a Kubernetes object name (DNS subdomain)
MAX_SHORT = 64  # GPU, engine and precision names
MAX_DURATION = 32  # `1h30m`: a duration string, never thousands of digits
MAX_URL = 2048
MAX_LABELS = 32  # label matchers of a selector, entries of a node selector
MAX_LABEL_KEY = 317  # a Kubernetes label key: a 253-character prefix, '/', a 63-character name
MAX_LABEL_VALUE = 256  # a Prometheus label value in a matcher (a Kubernetes label value is 63 at most)
MAX_IMAGE = 512
MAX_LIST = 32
MAX_MS = 86_400_000.0  # a day, in milliseconds
MAX_TOKENS = 10_000_000
MAX_RATE = 1_000_000.0
# The slowest arrival rate a spec may name: one request a day. Below it a replay of the workload's
# requests spans more simulated time than a float keeps in step (1e-308 req/s stalled the simulator).
MIN_RATE = 1.0 / 86_400
# A model name: the CLI also takes a path to a config.json (PATH_MAX); the operator takes names
# only (inferasim.catalog.models.check_model_id) and its CRD bounds them tighter (crds.py).
MAX_MODEL = 4096

LabelKey = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]


class TargetRef(_Model):
    """The live deployment being tuned (the operator recommends; it never changes it)."""

    kind: Literal["Deployment", "StatefulSet", "LeaderWorkerSet"] = "Deployment"
    name: str = Field(min_length=1, max_length=MAX_NAME,
                      description="Name of the workload in the ServingTuning's namespace.")


class Hardware(_Model):
    gpu: str = Field(max_length=MAX_SHORT,
                     description="GPU product, any accepted spelling: MI355X, AMD_Instinct_MI355X, NVIDIA-H200 ...")
    gpus_per_node: int = Field(8, ge=1, le=1024, description="GPUs per node (scale-up domain of one node).")
    max_gpus: int = Field(8, ge=1, le=65536, alias="maxGPUs", description="GPU budget of the recommended deployment.")
    price_per_gpu_hour: float | None = Field(None, ge=0, le=10_000, description="For the cost view ($/GPU-hour).")

    @field_validator("gpu")
    @classmethod
    def _gpu_known(cls, v: str) -> str:
        get_gpu(v)  # an unknown name fails here, where the error can name hardware.gpu
        return v

    @model_validator(mode="after")
    def _node_fits_the_platform(self) -> Hardware:
        """A node holds at most the GPUs its platform has (catalog: 8 on an OAM or HGX board, 4 on a
        GB200 tray): a search over 64-GPU nodes of MI355X would recommend layouts no node runs. Left
        unset, it is the platform's own count."""
        most = get_gpu(self.gpu).gpus_per_node
        if "gpus_per_node" not in self.model_fields_set:
            self.gpus_per_node = min(self.gpus_per_node, most)
        elif self.gpus_per_node > most:
            raise ValueError(f"gpusPerNode={self.gpus_per_node} exceeds the {most} GPUs a node of "
                             f"{get_gpu(self.gpu).name} holds; give at most {most}")
        return self


class SLO(_Model):
    ttft_p90_ms: float | None = Field(None, gt=0, le=MAX_MS, description="90th percentile time to first token, ms.")
    itl_p90_ms: float | None = Field(None, gt=0, le=MAX_MS, description="90th percentile inter-token latency, ms.")
    ttft_p99_ms: float | None = Field(None, gt=0, le=MAX_MS)
    itl_p99_ms: float | None = Field(None, gt=0, le=MAX_MS)


# Shorthands of `objective` (no SLO: give the object form for one).
OBJECTIVE_SHORTHANDS: dict[str, dict[str, str]] = {
    "max-throughput-per-gpu": {"maximize": "throughputPerGPU"},
    "max-goodput": {"maximize": "goodput"},
    "min-gpus": {"minimize": "gpus"},
    "min-cost": {"minimize": "costPerMillionTokens"},
}


class Objective(_Model):
    maximize: Literal["throughputPerGPU", "goodput"] | None = Field(
        "throughputPerGPU", description="What to maximize under the SLO.")
    minimize: Literal["gpus", "costPerMillionTokens"] | None = Field(
        None, description="Or what to minimize while serving the workload's rate within the SLO.")
    slo: SLO = Field(default_factory=SLO)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `objective: min-cost` in a SPEC.yaml (the CLI; the CRD keeps the object form, whose
        # schema the API server checks, and spells the SLO there).
        if isinstance(data, str):
            if data not in OBJECTIVE_SHORTHANDS:
                raise ValueError(f"objective {data!r} is not one of {', '.join(OBJECTIVE_SHORTHANDS)} (or give "
                                 "maximize/minimize and slo)")
            return dict(OBJECTIVE_SHORTHANDS[data])
        return data

    @model_validator(mode="after")
    def _one_goal(self) -> Objective:
        if self.minimize is not None:
            if "maximize" in self.model_fields_set and self.maximize is not None:
                raise ValueError(f"objective has both maximize ({self.maximize}) and minimize ({self.minimize}); "
                                 "keep the one to optimise")
            self.maximize = None
        if self.maximize is None and self.minimize is None:
            raise ValueError("objective needs maximize (throughputPerGPU | goodput) or minimize (gpus | "
                             "costPerMillionTokens)")
        return self


class StaticWorkload(_Model):
    """A workload described by its shape; `kind` picks the arrival process."""

    kind: Literal["closed", "poisson", "multi-turn"] = "poisson"
    request_rate: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="Requests/s (poisson).")
    sessions_per_second: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE,
                                               description="New sessions/s (multi-turn).")
    concurrency: int | None = Field(None, ge=1, le=1_000_000, description="Clients (closed loop).")
    input_tokens: int = Field(1024, ge=1, le=MAX_TOKENS, description="Prompt tokens (first turn for multi-turn).")
    output_tokens: int = Field(256, ge=1, le=MAX_TOKENS, description="Output tokens per request.")
    turns: int = Field(1, ge=1, le=1000, description="Turns per session (multi-turn).")
    think_time_s: float = Field(0.0, ge=0, le=86_400, description="Pause between a reply and the next turn.")
    user_tokens_per_turn: int = Field(0, ge=0, le=MAX_TOKENS, description="New user tokens added by each later turn.")
    prefix_hit_rate: float | None = Field(None, ge=0, le=1, description="Observed prefix-cache hit rate.")
    num_requests: int = Field(2000, ge=1, le=1_000_000, description="Requests to simulate in stage 2.")

    @model_validator(mode="after")
    def _rate_given(self) -> StaticWorkload:
        need = {"closed": "concurrency", "poisson": "request_rate", "multi-turn": "sessions_per_second"}[self.kind]
        if getattr(self, need) is None:
            raise ValueError(f"workload kind {self.kind!r} needs {to_camel(need)}")
        return self


class PrometheusWorkload(_Model):
    url: str = Field("", max_length=MAX_URL, description=(
        "Prometheus HTTP API base URL. Empty: the operator's default (chart value prometheus.url); "
        "the CLI needs it."))
    # Bounded so that every query built from it stays a URL an HTTP client sends (2,000 matchers
    # once made the query component too long, an error no retry fixes).
    selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS,
                                                 description="Label matchers of the target's series.")
    window: str = Field("1h", max_length=MAX_DURATION, description="Range of the rate() windows, e.g. 5m, 6h.")


class TraceWorkload(_Model):
    path: str = Field(max_length=4096, description="Mooncake JSONL or Azure CSV trace file.")
    format: Literal["mooncake", "azure", "auto"] = "auto"
    time_scale: float = Field(1.0, gt=0, le=1e6, description="Multiply arrival times by this (0.5 = twice the rate).")
    sample: int | None = Field(None, ge=1, le=100_000_000, description="Use only the first N requests.")


class WorkloadSource(_Model):
    static: StaticWorkload | None = None
    prometheus: PrometheusWorkload | None = None
    trace: TraceWorkload | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> WorkloadSource:
        given = [k for k in ("static", "prometheus", "trace") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"workload needs exactly one of static, prometheus, trace (got {given or 'none'})")
        return self


class Toleration(_Model):
    """A Kubernetes pod toleration (core/v1 Toleration), for the harvest Jobs' pods."""

    key: str | None = Field(None, max_length=MAX_LABEL_KEY, description="Taint key; empty with Exists: every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default).")
    value: str | None = Field(None, max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to tolerate; empty: all.")
    toleration_seconds: int | None = Field(None, ge=0, le=2**31 - 1,
                                           description="How long a NoExecute taint is tolerated, seconds.")

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        # The API server's own rules for a Toleration: refused here, the Job is not refused later.
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


class HarvestPolicy(_Model):
    allowed: bool = False
    max_gpu_hours: float = Field(4.0, ge=0, le=1_000_000, alias="maxGPUHours",
                                 description="GPU-hours all harvests may use.")
    deadline_minutes: int = Field(60, ge=1, le=10_080)  # a week
    images: dict[Annotated[str, Field(max_length=MAX_SHORT)], Annotated[str, Field(max_length=MAX_IMAGE)]] = Field(
        default_factory=dict, max_length=len(ENGINES), description="Engine -> image to harvest with.")
    node_selector: dict[LabelKey, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict,
                                                                               max_length=MAX_LABELS)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_LIST)

    @field_validator("images")
    @classmethod
    def _image_engines_known(cls, v: dict[str, str]) -> dict[str, str]:
        # Keyed by engine: a key that names none ("vLLM ", "sgl") would be ignored silently and the
        # catalog's image harvested instead of the one asked for.
        out = {}
        for engine, image in v.items():
            name = engine.strip().lower()
            if name not in ENGINES:
                raise ValueError(f"key {engine!r} is not an engine; accepted: {', '.join(ENGINES)}")
            if not str(image).strip():
                raise ValueError(f"the image for {name} is empty")
            out[name] = str(image).strip()
        return out


class Confirmation(_Model):
    mode: Literal["none", "canary", "argo-rollouts"] = "none"
    window: str = Field("30m", max_length=MAX_DURATION,
                        description="How long each canary serves before it is measured, counted from when it "
                                    "becomes available (its pods Ready), not from its creation.")
    # Pulling an engine image and loading the weights of a large model take minutes to tens of
    # minutes; a canary not available by then holds GPUs it will never be measured on.
    startup_timeout: str = Field("1h", max_length=MAX_DURATION,
                                 description="How long a canary may take to become available before it is "
                                             "given up (Failed) and its GPUs released.")
    candidates: int = Field(2, ge=0, le=5)


class Retune(_Model):
    every: str | None = Field(None, max_length=MAX_DURATION, description="Re-tune period, e.g. 24h.")
    drift_threshold: float = Field(0.25, gt=0, le=100, description="Re-tune when the workload moves this much.")
    prediction_error_threshold: float = Field(
        0.25, gt=0, le=100, description="PredictionDrift when observed TTFT, ITL or throughput of the running "
                                "configuration is off its anchor's prediction by more than this fraction.")


class SearchSpace(_Model):
    """Limits of the configuration space (defaults cover what the engines usually run)."""

    # Each list is tried as given: an empty one would leave nothing to search, a limit below one
    # request (or one token per step) no engine accepts.
    max_num_seqs: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=lambda: [64, 128, 256, 512, 1024], min_length=1, max_length=MAX_LIST)
    max_num_batched_tokens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [2048, 4096, 8192, 16384], min_length=1, max_length=MAX_LIST)
    chunked_prefill: list[bool] = Field(default_factory=lambda: [True, False], min_length=1, max_length=2)
    disaggregation: bool = Field(True, description="Also consider prefill/decode pools.")
    expert_parallel: bool = True
    attention_dp: bool = True
    pipeline_parallel: bool = True


class Capacity(_Model):
    """A capacity question tune answers beside its recommendation (search.capacity)."""

    question: Literal["maxRate", "gpusForRate"] = Field(
        description="maxRate: the most requests/s hardware.maxGPUs serves within the SLO; gpusForRate: the "
                    "fewest GPUs that serve requestRate (or the workload's own rate) within the SLO.")
    request_rate: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE,
                                       description="Requests/s to serve (gpusForRate; default: the workload's rate).")


# A Kubernetes object name (DNS-1123 subdomain) and an extended resource name (domain/name).
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class DeploySpec(_Model):
    """How the recommendation's manifests run (inferasim.render_pod.RenderOptions; `inferasim render`
    takes the same as flags)."""

    model_cache_pvc: str | None = Field(
        None, min_length=1, max_length=MAX_NAME, pattern=K8S_NAME_PATTERN, alias="modelCachePVC",
        description="An existing PersistentVolumeClaim (ReadWriteMany, or ReadOnlyMany with offline) mounted at "
                    "HF_HOME: weights downloaded once, reused by every pod. Empty: an emptyDir per pod.")
    offline: bool = Field(False, description="Load the model from modelCachePVC only (HF_HUB_OFFLINE=1, the "
                                             "claim mounted read-only); needs modelCachePVC.")
    runtime_class_name: str | None = Field(
        None, min_length=1, max_length=MAX_NAME, pattern=K8S_NAME_PATTERN,
        description="NVIDIA: the RuntimeClass of the NVIDIA container runtime (e.g. nvidia), where it is not the "
                    "node's default runtime.")
    rocm_render_gid: int | None = Field(None, ge=0, le=2**31 - 1, alias="rocmRenderGID",
                                        description="AMD: the GID of the nodes' render group (owner of "
                                                    "/dev/dri/renderD*), added to the pods' groups beside video (44).")
    rdma_resource: str | None = Field(
        None, min_length=3, max_length=MAX_LABEL_KEY, pattern=RESOURCE_NAME_PATTERN,
        description="P/D: the RDMA device plugin's resource each prefill and decode pod requests, e.g. "
                    "rdma/hca_shared_devices_a.")
    rdma_count: int = Field(1, ge=1, le=64, description="P/D: how many rdmaResource each pod requests.")
    kv_transfer_backend: Literal["mooncake", "nixl"] = Field(
        "mooncake", description="SGLang P/D: --disaggregation-transfer-backend.")
    router_image: str | None = Field(None, min_length=1, max_length=MAX_IMAGE,
                                     description="P/D: the router's image (default: the engine's image).")
    pod_disruption_budget: bool = Field(True, description="Render a PodDisruptionBudget (maxUnavailable 1) per "
                                                          "Deployment.")

    @model_validator(mode="after")
    def _offline_needs_cache(self) -> DeploySpec:
        if self.offline and not self.model_cache_pvc:
            raise ValueError("offline loading needs modelCachePVC (a claim that already holds the weights); set "
                             "deploy.modelCachePVC or drop deploy.offline")
        return self


class TuningSpec(_Model):
    """Everything `inferasim tune` needs: the same fields as a ServingTuning's spec."""

    target: TargetRef | None = None
    model: str = Field(max_length=MAX_MODEL, description="Hugging Face id, or a path to a config.json (the "
                                                         "operator takes Hugging Face ids only).")
    precision: list[Annotated[str, Field(max_length=MAX_SHORT)]] = Field(
        default_factory=lambda: ["auto"], max_length=MAX_LIST, description="Precisions to consider.")
    hardware: Hardware
    engines: list[Annotated[str, Field(max_length=MAX_SHORT)]] = Field(default_factory=lambda: list(ENGINES),
                                                                       max_length=MAX_LIST)
    objective: Objective = Field(default_factory=Objective)
    capacity: Capacity | None = Field(None, description="Also answer a capacity question (maxRate, gpusForRate).")
    workload: WorkloadSource
    search: SearchSpace = Field(default_factory=SearchSpace)
    harvest: HarvestPolicy = Field(default_factory=HarvestPolicy)
    confirmation: Confirmation = Field(default_factory=Confirmation)
    retune: Retune = Field(default_factory=Retune)
    deploy: DeploySpec = Field(default_factory=DeploySpec,
                               description="How the rendered manifests run: model cache, pod settings, P/D router.")

    @field_validator("engines")
    @classmethod
    def _engines_known(cls, v: list[str]) -> list[str]:
        out = []
        for e in v:
            name = e.strip().lower()
            if name not in ENGINES:
                raise ValueError(f"engine {e!r} is not supported; accepted: {', '.join(ENGINES)}")
            out.append(name)
        if not out:
            raise ValueError("engines must list at least one of " + ", ".join(ENGINES))
        return out

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("precision")
    @classmethod
    def _precisions_known(cls, v: list[str]) -> list[str]:
        for p in v:
            normalize_precision(p)  # names the accepted spellings
        return v

    @model_validator(mode="after")
    def _deploy_fits_the_gpu(self) -> TuningSpec:
        # An option for the other vendor's GPUs would be rendered for nothing (or refused at render time).
        vendor = get_gpu(self.hardware.gpu).vendor
        if vendor == "amd" and self.deploy.runtime_class_name:
            raise ValueError("deploy.runtimeClassName is an NVIDIA container runtime option; AMD GPUs reach pods "
                             "through the ROCm device plugin: drop it")
        if vendor == "nvidia" and self.deploy.rocm_render_gid is not None:
            raise ValueError("deploy.rocmRenderGID is for AMD GPUs (the render group of ROCm nodes): drop it")
        return self

    @field_validator("model")
    @classmethod
    def _model_known(cls, v: str, info: ValidationInfo) -> str:
        # A catalog id, alias or config.json path; the error names the fix. A service validating
        # specs of others (the operator) passes context {"model_paths": False}: names only, and no
        # file is opened or even looked for.
        get_model(v, allow_path=(info.context or {}).get("model_paths"))
        return v


class SpecError(UserError):
    """A spec file that cannot be used; the message names the field and the fix."""


def plain_validation_error(exc: ValidationError, whole: str = "spec") -> str:
    """A pydantic error as `field.path: message; ...` (`whole` names an error of the whole
    object), without pydantic's type tags and links."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith("function-after"))
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or whole}: {msg}")
    return "; ".join(parts)


def parse_spec(data: dict[str, Any], *, model_paths: bool | None = None) -> TuningSpec:
    """A TuningSpec from a dict: a bare spec, or a whole ServingTuning manifest (its `spec`).
    ``model_paths=False``: `model` must be a Hugging Face id or a catalog name, never a path (the
    operator's rule; the CLI accepts a path to a config.json). None: get_model's process default."""
    if not isinstance(data, dict):
        raise SpecError("the spec must be a YAML mapping")
    if "kind" in data or "apiVersion" in data:
        if data.get("kind") != "ServingTuning":
            raise SpecError(f"a manifest of kind {data.get('kind')!r} is not a ServingTuning; give a ServingTuning "
                            "or its bare spec")
        extra = sorted(set(data) - {"apiVersion", "kind", "metadata", "spec", "status"})
        if extra:
            raise SpecError(f"a ServingTuning manifest has apiVersion, kind, metadata, spec and status; not "
                            f"{', '.join(extra)}")
        data = data.get("spec") or {}
    try:
        ctx = None if model_paths is None else {"model_paths": model_paths}
        return TuningSpec.model_validate(data, context=ctx)
    except ValidationError as exc:
        raise SpecError(plain_validation_error(exc)) from None


def load_spec(path: str | Path) -> TuningSpec:
    p = Path(path)
    try:
        data = load_yaml(read_user_text(p, "spec file"))
    except UserFileError as exc:
        raise SpecError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{p} is not valid YAML: {exc}") from None
    try:
        return parse_spec(data)
    except SpecError as exc:
        raise SpecError(f"{p}: {exc}") from None
