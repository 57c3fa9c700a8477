"""What the operator does for one ServingTuning: observe, resolve anchors, harvest, search, publish.

The kopf handlers (handlers.py) are thin: they call :func:`reconcile` (create, update, resume) and
:func:`tick` (the re-tune timer). Every step writes the status (merge patch on /status) and posts a
Kubernetes Event, so `kubectl describe` tells the story. Blocking API calls run in threads; the
search runs in a child process (search.py).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import yaml

from inferasim.core.spec import SpecError, TuningSpec, WorkloadSource, parse_spec
from inferasim.live import search_view
from inferasim.model.anchors import Anchor, AnchorStore
from inferasim.observe import ObservationError, ObservedWorkload, drift, observe
from inferasim_operator import kube as kube_mod
from inferasim_operator import metrics
from inferasim_operator.harvest import (
    JOB_TTL_AFTER_FINISHED_S,
    HarvestTarget,
    MessageError,
    anchor_object,
    build_job,
    decode_anchor,
    job_limits,
    terminated_message,
)
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.models import (
    HISTORY_SIZE,
    LABEL_ANCHOR,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TUNING,
    MANAGER,
    SHORTLIST_SIZE,
    AnchorRef,
    Candidate,
    Condition,
    Harvest,
    HistoryEntry,
    LayoutStatus,
    MissingAnchor,
    Predicted,
    Recommendation,
    dump,
    label_value,
)
from inferasim_operator.search import SearchFailed, SearchTimeout, run_search
from inferasim_operator.times import RFC3339, age_s, now_iso

log = logging.getLogger("inferasim_operator")

DONE_PHASES = ("Recommended", "Harvesting", "Confirming", "Confirmed", "Invalid")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d|w))+$")
_PROMQL_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------


def _default_anchor_dirs() -> list[str]:
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "anchors", Path("/app/anchors")):
        if candidate.is_dir():
            return [str(candidate)]
    return []


@dataclass
class Settings:
    """Operator settings, from INFERASIM_* environment variables (the chart sets them)."""

    anchor_dirs: list[str] = field(default_factory=_default_anchor_dirs)
    anchor_cache: str = "/tmp/inferasim-anchors"
    timer_seconds: float = 30.0
    drift_check_seconds: float = 300.0
    search_timeout_s: float = 300.0
    stage2_top: int = 50
    harvester_image: str = "inferasim-operator:0.1.0"
    harvest_extra_args: list[str] = field(default_factory=list)
    observe_timeout_s: float = 10.0
    backoff_base_s: float = 10.0
    backoff_max_s: float = 600.0
    # GPU prices ($/GPU-hour per GPU type) for tunings whose spec gives none.
    price_config_map: str = "inferasim-gpu-prices"
    operator_namespace: str = "inferasim-system"
    # Passive anchors: the range of the target's series fitted, one window per step.
    passive_window_s: float = 3600.0
    passive_step_s: float = 60.0
    # Prediction error: the recent range compared with the prediction at each drift check.
    prediction_window_s: float = 300.0
    # Engine seconds per wall second: 1 for real engines; an emulator's --speedup where emulators
    # play the engines (their histograms record engine seconds, Prometheus rates are per wall second).
    engine_speedup: float = 1.0
    # Prometheus of tunings whose spec leaves workload.prometheus.url empty (chart: prometheus.url).
    prometheus_url: str = ""
    # Engine images of harvest Jobs per (GPU vendor, engine) where a tuning's harvest.images names
    # none (chart: engineImages); otherwise the catalog's image for the GPU.
    engine_images: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        s = cls()

        def num(key: str, default: float, minimum: float) -> float:
            raw = env.get(key)
            if raw is None or raw == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} is not a number") from None
            if not value >= minimum:
                raise ValueError(f"{key}={raw!r} must be >= {minimum}")
            return value

        if env.get("INFERASIM_ANCHOR_DIRS") is not None:
            s.anchor_dirs = [d for d in env["INFERASIM_ANCHOR_DIRS"].split(os.pathsep) if d]
        s.anchor_cache = env.get("INFERASIM_ANCHOR_CACHE") or s.anchor_cache
        s.timer_seconds = num("INFERASIM_TIMER_SECONDS", s.timer_seconds, 0.5)
        s.drift_check_seconds = num("INFERASIM_DRIFT_CHECK_SECONDS", s.drift_check_seconds, 0.5)
        s.search_timeout_s = num("INFERASIM_SEARCH_TIMEOUT_S", s.search_timeout_s, 1)
        s.stage2_top = int(num("INFERASIM_STAGE2_TOP", s.stage2_top, 0))
        s.harvester_image = env.get("INFERASIM_HARVESTER_IMAGE") or s.harvester_image
        s.harvest_extra_args = (env.get("INFERASIM_HARVEST_ARGS") or "").split()
        s.observe_timeout_s = num("INFERASIM_OBSERVE_TIMEOUT_S", s.observe_timeout_s, 0.1)
        s.backoff_base_s = num("INFERASIM_BACKOFF_BASE_S", s.backoff_base_s, 0.1)
        s.backoff_max_s = num("INFERASIM_BACKOFF_MAX_S", s.backoff_max_s, s.backoff_base_s)
        s.price_config_map = env.get("INFERASIM_PRICE_CONFIGMAP", s.price_config_map)
        s.prometheus_url = env.get("INFERASIM_PROMETHEUS_URL", s.prometheus_url).strip()
        s.engine_images = parse_engine_images(env.get("INFERASIM_ENGINE_IMAGES", ""))
        s.operator_namespace = env.get("INFERASIM_OPERATOR_NAMESPACE") or s.operator_namespace
        s.passive_step_s = num("INFERASIM_PASSIVE_STEP_S", s.passive_step_s, 1)
        s.passive_window_s = num("INFERASIM_PASSIVE_WINDOW_S", s.passive_window_s, 3 * s.passive_step_s)
        s.prediction_window_s = num("INFERASIM_PREDICTION_WINDOW_S", s.prediction_window_s, 1)
        s.engine_speedup = num("INFERASIM_ENGINE_SPEEDUP", s.engine_speedup, 1e-6)
        return s


def parse_engine_images(text: str) -> dict[tuple[str, str], str]:
    """`amd/vllm=IMAGE,nvidia/sglang=IMAGE,...` (INFERASIM_ENGINE_IMAGES; empty images are skipped:
    the catalog's choice for the GPU stays)."""
    from inferasim.catalog.engines import ENGINES

    out: dict[tuple[str, str], str] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        key, sep, image = item.partition("=")
        vendor, slash, engine = key.strip().partition("/")
        if not sep or not slash or vendor not in ("amd", "nvidia") or engine not in ENGINES:
            raise ValueError(f"INFERASIM_ENGINE_IMAGES: {item!r} is not VENDOR/ENGINE=IMAGE with vendor amd or "
                             f"nvidia and engine one of {', '.join(ENGINES)}")
        if image.strip():
            out[(vendor, engine)] = image.strip()
    return out


def backoff(settings: Settings, retries: int) -> float:
    """Exponential backoff of retries after a failed observation or search."""
    # The exponent is capped: a week of failures at the cap (retries past 1,000) overflowed a float.
    return min(settings.backoff_base_s * 2 ** min(max(retries - 1, 0), 32), settings.backoff_max_s)


MAX_DURATION_S = 366 * 86400.0


def parse_duration(text: str | None, field_name: str) -> float | None:
    """`24h`, `30m`, `1h30m` -> seconds, at most a year; SpecError naming the field otherwise."""
    if text is None:
        return None
    shown = repr(text[:40] + "...") if isinstance(text, str) and len(text) > 40 else repr(text)
    if not isinstance(text, str) or not _DURATION.match(text.strip()):
        raise SpecError(f"{field_name}: {shown} is not a duration such as 30m, 24h or 1h30m")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text))
    # Bounded: thousands of digits read as an infinite float, which then reached the status patch
    # (a canary's GPU-hours) and made the API server refuse the whole status write.
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise SpecError(f"{field_name}: {shown} is longer than a year (366d)")
    return seconds


# --------------------------------------------------------------------------------------------
# status bookkeeping
# --------------------------------------------------------------------------------------------


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: int | None) -> list[dict[str, Any]]:
    """The conditions with ``type_`` replaced; lastTransitionTime moves only when status changes."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    when = old.get("lastTransitionTime") if old and old.get("status") == status else now_iso()
    new = dump(Condition(type=type_, status=status, reason=reason, message=message[:1024],
                         last_transition_time=when or now_iso(), observed_generation=generation))
    out = [c for c in conditions if c.get("type") != type_] + [new]
    order = {"WorkloadObserved": 0, "AnchorsReady": 1, "Priced": 2, "Recommended": 3, "Confirmed": 4,
             "PredictionDrift": 5, "Degraded": 6}
    return sorted(out, key=lambda c: order.get(c.get("type", ""), 9))


class StatusNotWritable(ValueError):
    """A status patch the API server would refuse (a number JSON cannot carry); never sent."""


def non_finite_paths(obj: Any, path: str = "status") -> list[str]:
    """Where ``obj`` holds a float that is inf or nan (JSON has no such number: the API server
    refuses the whole patch, HTTP 500 Invalid JSON Patch)."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in non_finite_paths(v, f"{path}.{k}")]
    if isinstance(obj, list | tuple):
        return [p for i, v in enumerate(obj) for p in non_finite_paths(v, f"{path}[{i}]")]
    return []


class StatusBook:
    """The status as last written (camelCase dict) and the patches that change it."""

    def __init__(self, body: dict[str, Any], kube: Kube) -> None:
        self.body = body
        self.kube = kube
        meta = body["metadata"]
        self.namespace, self.name = meta["namespace"], meta["name"]
        self.uid = meta.get("uid", f"{self.namespace}/{self.name}")
        self.generation = meta.get("generation")
        self.status: dict[str, Any] = json.loads(json.dumps(dict(body.get("status") or {})))
        self._pending: dict[str, Any] = {}
        self._written: dict[str, Any] = {}  # each pending key's value as the server holds it
        self.touched: set[str] = set()  # condition types this book (one pass) has written

    def get(self, key: str, default: Any = None) -> Any:
        return self.status.get(key, default)

    def set(self, **fields: Any) -> None:
        for k, v in fields.items():
            if k not in self._pending:
                self._written[k] = copy.deepcopy(self.status.get(k))
            self.status[k] = v
            self._pending[k] = v

    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.touched.add(type_)
        self.set(conditions=set_condition(self.status.get("conditions") or [], type_, status, reason, message,
                                          self.generation))

    def discard(self) -> None:
        """Forget the changes not written yet (a pass that failed half-way): the book reads as the
        server holds the status again."""
        for k, old in self._written.items():
            self.status[k] = old
        self._pending, self._written = {}, {}

    def cond(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == type_), None)

    async def flush(self) -> None:
        if not self._pending:
            return
        # A merge patch merges nested objects: a sub-object written whole must also null what the
        # server holds and the new value lacks (a removed price's cost, an old prediction error's
        # figures next to a message that nothing was computed).
        patch = {k: kube_mod.merge_patch_to(self._written.get(k), v) for k, v in self._pending.items()}
        bad = non_finite_paths(patch)
        if bad:
            # Refused here, whole: the book goes back to what the server holds, and the caller's pass
            # ends (reconcile's guard reports it as Degraded) before anything is published.
            self.discard()
            raise StatusNotWritable(f"the status patch holds numbers JSON cannot carry (inf or nan) at "
                                    f"{', '.join(bad[:5])}; it was not sent")
        self._pending, self._written = {}, {}
        try:
            await asyncio.to_thread(self.kube.patch_tuning_status, self.namespace, self.name, patch)
        except ApiException as exc:
            if exc.status == 404:
                raise kopf.PermanentError("the ServingTuning was deleted") from None
            raise
        if "phase" in patch:
            metrics.set_phase(self.uid, patch["phase"])


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the ServingTuning (through kopf's poster); logged when kopf is not running."""
    try:
        kopf.event(body, type=type_, reason=reason, message=message[:1024])
    except LookupError:  # outside a running operator (handler functions driven directly)
        pass
    (log.warning if type_ == "Warning" else log.info)("%s/%s %s: %s", body["metadata"].get("namespace"),
                                                      body["metadata"].get("name"), reason, message)


# --------------------------------------------------------------------------------------------
# spec
# --------------------------------------------------------------------------------------------


def parse_tuning_spec(spec: dict[str, Any], default_prometheus_url: str = "") -> TuningSpec:
    """The spec as the operator accepts it: TuningSpec plus the operator's own rules. An empty
    `workload.prometheus.url` is the operator's default Prometheus (`default_prometheus_url`)."""
    # model_paths=False: a model is a Hugging Face id or a catalog name here, never a path the
    # operator would open on its own filesystem (and whose existence its messages would reveal).
    parsed = parse_spec(json.loads(json.dumps(dict(spec))), model_paths=False)
    prom = parsed.workload.prometheus
    if prom is not None and not prom.url:
        if not default_prometheus_url:
            raise SpecError("workload.prometheus.url: empty, and the operator has no default Prometheus (set the "
                            "chart value prometheus.url, env INFERASIM_PROMETHEUS_URL, or give the URL here)")
        prom.url = default_prometheus_url
    if parsed.target is None:
        raise SpecError("target: required (the Deployment whose workload is tuned)")
    if parsed.workload.trace is not None:
        raise SpecError("workload.trace: the operator observes `prometheus` workloads or takes a `static` one; "
                        "run trace files with `inferasim simulate`")
    parse_duration(parsed.retune.every, "retune.every")
    parse_duration(parsed.confirmation.window, "confirmation.window")
    parse_duration(parsed.confirmation.startup_timeout, "confirmation.startupTimeout")
    if parsed.confirmation.mode != "none" and not _PROMQL_DURATION.match(parsed.confirmation.window.strip()):
        # The window is also a PromQL range (the canary's and the AnalysisTemplate's queries).
        raise SpecError(f"confirmation.window: {parsed.confirmation.window!r} must be whole numbers of units, as "
                        "PromQL reads ranges (90m, not 1.5h)")
    return parsed


def render_name(spec: TuningSpec, tuning_name: str) -> str:
    """Name of the recommended Deployment: the target's, so that GitOps replaces it in place."""
    name = spec.target.name if spec.target else tuning_name
    return name if len(name) <= 63 and _DNS1035.match(name) else tuning_name[:63]


# --------------------------------------------------------------------------------------------
# anchors: ServingAnchors -> files the search reads
# --------------------------------------------------------------------------------------------

_anchor_sync_lock = asyncio.Lock()


_shipped: dict[tuple[str, ...], list[Anchor]] = {}


def shipped_anchors(dirs: list[str]) -> list[Anchor]:
    """The anchors of the shipped folders (read once: they do not change while the operator runs)."""
    key = tuple(dirs)
    if key not in _shipped:
        _shipped[key] = AnchorStore(*dirs).all()
    return _shipped[key]


def _sync_anchor_files(kube: Kube, cache: Path, shipped: list[str] | None = None) -> int:
    cache.mkdir(parents=True, exist_ok=True)
    found: list[tuple[str, Anchor]] = []
    for obj in kube.list_anchors():
        try:
            anchor = Anchor.model_validate(obj.get("spec") or {})
        except ValueError as exc:
            log.warning("ServingAnchor %s is not a valid anchor, skipped: %s", obj["metadata"]["name"], exc)
            continue
        found.append((obj["metadata"]["name"], anchor))
    # A passive anchor stays a ServingAnchor beside a harvested one, but the search (which picks by
    # point count) must not see it there: live traffic never silently overrides a harvest.
    keep = {id(a) for a in search_view([a for _, a in found], shipped_anchors(shipped or []))}
    wanted: dict[str, str] = {}
    for name, anchor in found:
        if id(anchor) in keep:
            # Named after the object, not anchor.filename(): a canary anchor and the harvested anchor
            # of the same kernel set and layout share a filename, and the store keeps both.
            wanted[f"{name}.json"] = anchor.model_dump_json(indent=2) + "\n"
    for name, text in wanted.items():
        path = cache / name
        if not path.exists() or path.read_text() != text:
            tmp = cache / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
    for path in cache.glob("*.json"):
        if path.name not in wanted:
            path.unlink(missing_ok=True)
    return len(wanted)


async def sync_anchors(kube: Kube, settings: Settings) -> int:
    async with _anchor_sync_lock:
        return await asyncio.to_thread(_sync_anchor_files, kube, Path(settings.anchor_cache), settings.anchor_dirs)


def anchor_dirs(settings: Settings) -> list[str]:
    return [*settings.anchor_dirs, settings.anchor_cache]


# --------------------------------------------------------------------------------------------
# GPU prices: the spec's, else the operator's ConfigMap
# --------------------------------------------------------------------------------------------


class PriceError(ValueError):
    """A price entry that is not a usable number; ``key`` names the ConfigMap key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def price_from_data(data: dict[str, str], gpu: str, where: str) -> tuple[float, str] | None:
    """($/GPU-hour, key) for ``gpu`` from a prices ConfigMap's data, keys matched after
    normalize_gpu_name (so `MI300X`, `mi300x` and `AMD_Instinct_MI300X_OAM` are one GPU); None when
    no key names it. PriceError naming the key when its value is not a positive finite number."""
    from inferasim.catalog.gpus import UnknownGPUError, normalize_gpu_name

    want = normalize_gpu_name(gpu)
    for key in sorted(data):
        try:
            if normalize_gpu_name(key) != want:
                continue
        except UnknownGPUError:
            continue  # a GPU this catalog does not know cannot be the tuning's
        raw = data[key]
        try:
            value = float(str(raw).strip().lstrip("$"))
        except ValueError:
            raise PriceError(key, f"{where} key {key!r}: {raw!r} is not a number ($/GPU-hour)") from None
        if not math.isfinite(value) or value <= 0:
            raise PriceError(key, f"{where} key {key!r}: {raw!r} is not a positive price ($/GPU-hour)")
        return value, key
    return None


async def resolve_price(spec: TuningSpec, kube: Kube, settings: Settings) -> tuple[float | None, str, str, str]:
    """(price, condition status, reason, message) of the Priced condition. The spec wins; a
    missing, unreadable or bad ConfigMap entry leaves the tuning unpriced, never failed."""
    if spec.hardware.price_per_gpu_hour is not None:
        p = spec.hardware.price_per_gpu_hour
        return p, "True", "SpecPrice", f"${p:g}/GPU-hour from hardware.pricePerGpuHour"
    ns, name = settings.operator_namespace, settings.price_config_map
    where = f"ConfigMap {ns}/{name}"
    if not name:
        return None, "False", "NoPrice", "no hardware.pricePerGpuHour and no prices ConfigMap configured"
    try:
        cm = await asyncio.to_thread(kube.get_config_map, ns, name)
    except ApiException as exc:
        return None, "False", "PriceConfigMapUnreadable", f"cannot read {where}: HTTP {exc.status} {exc.reason}"
    if cm is None:
        return None, "False", "NoPrice", f"no hardware.pricePerGpuHour and no {where}: costs are not shown"
    try:
        found = price_from_data(dict(cm.get("data") or {}), spec.hardware.gpu, where)
    except PriceError as exc:
        return None, "False", "BadPrice", str(exc)
    if found is None:
        return None, "False", "NoPrice", f"no hardware.pricePerGpuHour and {where} has no entry for " \
                                         f"{spec.hardware.gpu}: costs are not shown"
    price, key = found
    return price, "True", "ConfigMapPrice", f"${price:g}/GPU-hour from {where} key {key!r}"


# --------------------------------------------------------------------------------------------
# harvest Jobs
# --------------------------------------------------------------------------------------------


def job_state(job: dict[str, Any]) -> str:
    st = job.get("status") or {}
    for c in st.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") == "Complete":
            return "Succeeded"
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "Failed"
    if (st.get("succeeded") or 0) > 0:
        return "Succeeded"
    if (st.get("active") or 0) > 0:
        return "Running"
    return "Pending"


def _unscheduled_reason(kube: Kube, job: dict[str, Any]) -> str:
    """Why no pod of an active Job is on a node ('' when one is): the scheduler's message (no
    node with the GPU's labels, not enough GPUs ...), which otherwise shows only at the deadline."""
    meta = job["metadata"]
    try:
        pods = kube.list_pods(meta["namespace"], f"job-name={meta['name']}")
    except ApiException:
        return ""
    waiting = []
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            return ""
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                waiting.append(f"{c.get('reason') or 'Unschedulable'}: {c.get('message') or ''}".strip(": "))
    return "; ".join(waiting)[:400]


def _job_failure(job: dict[str, Any]) -> str:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            return f"{c.get('reason', 'Failed')}: {c.get('message', '')}".strip(": ")
    return "failed"


async def import_harvest(kube: Kube, job: dict[str, Any], harvested_by: str) -> tuple[Anchor, bool]:
    """The anchor a succeeded harvest Job wrote in its pod's termination message, as a ServingAnchor.
    Returns (anchor, whether the ServingAnchor was created now)."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    pods = await asyncio.to_thread(kube.list_pods, ns, f"job-name={name}")
    problems = []
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True):
        if (pod.get("status") or {}).get("phase") != "Succeeded":
            continue
        message = terminated_message(pod)
        try:
            anchor = decode_anchor(message or "")
        except MessageError as exc:
            problems.append(f"pod {pod['metadata']['name']}: {exc}")
            continue
        body = anchor_object(anchor, harvested_by=harvested_by, job=f"{ns}/{name}")
        created = await asyncio.to_thread(kube.create_anchor, body)
        if not created:
            return anchor, False
        try:
            await asyncio.to_thread(kube.patch_anchor_status, body["metadata"]["name"],
                                    {"harvestedBy": harvested_by, "job": f"{ns}/{name}", "importedAt": now_iso()})
        except ApiException as exc:  # status is informative only
            log.warning("cannot write the status of ServingAnchor %s: %s", body["metadata"]["name"], exc)
        _count_gpu_seconds(job, "succeeded")
        return anchor, True
    raise MessageError("; ".join(problems) or f"no succeeded pod of Job {ns}/{name} holds an anchor")


def _count_gpu_seconds(job: dict[str, Any], result: str) -> None:
    st = job.get("status") or {}
    start, end = st.get("startTime"), st.get("completionTime")
    gpus = int((job["metadata"].get("annotations") or {}).get("inferasim.io/gpus", "1") or 1)
    if not start:
        return
    s = age_s(start if isinstance(start, str) else start.strftime(RFC3339))
    e = age_s(end if isinstance(end, str) else end.strftime(RFC3339)) if end else 0.0
    if s is not None and e is not None and s >= e:
        engine = (job["metadata"].get("labels") or {}).get("inferasim.io/engine", "")
        metrics.HARVEST_GPU_SECONDS.labels(engine=engine, result=result).inc((s - e) * gpus)


async def plan_harvests(body: dict[str, Any], spec: TuningSpec, missing: list[dict[str, Any]], book: StatusBook,
                        kube: Kube, settings: Settings) -> tuple[list[Harvest], list[MissingAnchor], int]:
    """Start (or find) one Job per missing anchor within the GPU-hour budget.

    Returns (harvests in flight, missing anchors with reasons, anchors imported just now)."""
    anchors = book.get("anchors") or {}
    used = float(anchors.get("gpuHoursBudgeted") or 0.0)
    known = {h["job"]: h for h in anchors.get("harvesting") or []}
    harvesting: list[Harvest] = []
    missing_out: list[MissingAnchor] = []
    imported = 0
    owner = f"{book.namespace}/{book.name}"
    for m in sorted(missing, key=lambda m: (m["harvest_gpu_hours"], m["engine"], m["precision"])):
        target = HarvestTarget.from_missing(m)
        lay = LayoutStatus.model_validate(target.layout.as_dict())
        entry = MissingAnchor(engine=target.engine, model=target.model, gpu=target.gpu, precision=target.precision,
                              layout=lay, gpu_hours=round(target.gpu_hours, 4))
        # One Job per anchor in the whole cluster, whoever started it, across operator restarts.
        jobs = await asyncio.to_thread(kube.list_jobs, f"{LABEL_ANCHOR}={target.key}")
        if jobs:
            job = sorted(jobs, key=lambda j: j["metadata"]["name"])[0]
            state = job_state(job)
            where = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
            job_ns, job_name = job["metadata"]["namespace"], job["metadata"]["name"]
            refs = list(job["metadata"].get("ownerReferences") or [])
            owned = any(ref.get("uid") == book.uid for ref in refs)
            running = state not in ("Succeeded", "Failed")
            if not spec.harvest.allowed and owned and running:
                # Harvesting was switched off while a Job this tuning owns ran: it would hold its GPUs
                # to its deadline for an anchor the spec no longer wants. Deleted when no other tuning
                # owns it too; else this tuning lets go of it and the others keep it.
                others = [r for r in refs if r.get("uid") != book.uid]
                if others:
                    await asyncio.to_thread(kube.set_job_owners, job_ns, job_name, others)
                    entry.reason = f"harvest.allowed is false: harvest Job {where} is left to the other tunings"
                else:
                    await asyncio.to_thread(kube.delete_job, job_ns, job_name)
                    post_event(body, "Normal", "HarvestStopped", f"Job {where} deleted: harvest.allowed is false")
                    entry.reason = (f"harvest.allowed is false: its harvest Job {where} was deleted; predictions "
                                    "are unanchored")
                missing_out.append(entry)
                continue
            if spec.harvest.allowed and running and not owned and job_ns == book.namespace and \
                    (body.get("metadata") or {}).get("uid"):
                # Waiting for a Job another tuning of this namespace started: own it too, so that
                # deleting that tuning does not garbage-collect a measurement this one waits for.
                await asyncio.to_thread(kube.set_job_owners, job_ns, job_name, [*refs, kube_mod.sharing_owner(body)])
            if state == "Succeeded":
                try:
                    _, created = await import_harvest(kube, job, owner)
                    imported += int(created)
                    entry.reason = (f"harvested by Job {where}" if created else
                                    f"harvested by Job {where}, but its anchor does not match what the search needs")
                except MessageError as exc:
                    entry.reason = f"harvest Job {where} succeeded but {exc}"
            elif state == "Failed":
                entry.reason = (f"harvest Job {where} failed ({_job_failure(job)}); delete it to try again (it "
                                f"removes itself {JOB_TTL_AFTER_FINISHED_S // 3600} h after it finished)")
            else:
                entry.reason = f"being harvested by Job {where}"
                prev = known.get(job["metadata"]["name"], {})
                harvesting.append(Harvest(job=job["metadata"]["name"], job_namespace=job["metadata"]["namespace"],
                                          engine=target.engine, precision=target.precision, layout=lay,
                                          gpu_hours=float(prev.get("gpuHours", target.gpu_hours)), state=state,
                                          started=prev.get("started") or now_iso()))
            missing_out.append(entry)
            continue
        if not spec.harvest.allowed:
            entry.reason = "harvest.allowed is false: predictions for it are unanchored"
            missing_out.append(entry)
            continue
        remaining = spec.harvest.max_gpu_hours - used
        limits = job_limits(target, spec.harvest, remaining)
        if limits is None:
            entry.reason = (f"a harvest needs {target.gpu_hours:.2f} GPU-hours; {max(remaining, 0):.2f} of "
                            f"harvest.maxGPUHours ({spec.harvest.max_gpu_hours:g}) left")
            missing_out.append(entry)
            continue
        try:
            job = build_job(target, spec.harvest, limits, namespace=book.namespace, tuning=book.name,
                            harvester_image=settings.harvester_image, extra_harvest_args=settings.harvest_extra_args,
                            engine_images=settings.engine_images)
        except ValueError as exc:
            entry.reason = f"cannot harvest: {exc}"
            missing_out.append(entry)
            continue
        kube_mod.own(job, body)
        created = await asyncio.to_thread(kube.create_job, job)
        if created:
            used += limits.budget_gpu_hours
            metrics.HARVEST_JOBS.labels(engine=target.engine).inc()
            post_event(body, "Normal", "HarvestStarted",
                       f"Job {job['metadata']['name']} measures {target.kernel_set.describe()} at "
                       f"{target.layout.label()} ({target.layout.gpus} GPUs, at most {limits.budget_gpu_hours:.2f} "
                       f"GPU-hours, deadline {limits.active_deadline_s} s)")
        entry.reason = f"being harvested by Job {book.namespace}/{job['metadata']['name']}"
        missing_out.append(entry)
        harvesting.append(Harvest(job=job["metadata"]["name"], engine=target.engine, precision=target.precision,
                                  layout=lay, gpu_hours=round(limits.budget_gpu_hours, 4), state="Pending",
                                  started=now_iso()))
    book.set(anchors={**anchors, "gpuHoursBudgeted": round(used, 4)})
    return harvesting, missing_out, imported


# --------------------------------------------------------------------------------------------
# status pieces from a search payload
# --------------------------------------------------------------------------------------------


def _predicted(p: dict[str, Any]) -> Predicted:
    return Predicted(throughput_per_gpu=_finite(p.get("throughput_per_gpu_at_slo")),
                     max_request_rate_per_replica=_finite(p.get("max_request_rate_per_replica_at_slo")),
                     ttft_ms=_finite(p.get("ttft_ms")), tpot_ms=_finite(p.get("tpot_ms")),
                     ttft_p90_ms=_finite(p.get("ttft_p90_ms")), itl_p90_ms=_finite(p.get("itl_p90_ms")),
                     cost_per_million_tokens=_finite(p.get("cost_per_million_tokens")),
                     interval=_finite(p.get("interval_log")), stage=p.get("stage"))


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def candidate_of(entry: dict[str, Any], confirm_hours: float | None = None) -> Candidate:
    lay = entry["layout"]
    return Candidate(
        engine=entry["engine"], precision=entry["precision"],
        layout=LayoutStatus(tp=lay.get("tp", 1), pp=lay.get("pp", 1), dp=lay.get("dp", 1),
                            moe_tp=lay.get("moe_tp", 0), moe_ep=lay.get("moe_ep", 1)),
        # A disaggregated candidate's shape (P2xtp4+D1xtp8), not only its decode pool's layout.
        layout_label=entry.get("shape") or entry["layout_label"], replicas=entry["replicas"], gpus=entry["gpus"],
        max_num_seqs=entry.get("max_num_seqs"), max_num_batched_tokens=entry.get("max_num_batched_tokens"),
        chunked_prefill=entry.get("chunked_prefill"), predicted=_predicted(entry.get("predicted") or {}),
        meets_slo=bool(entry.get("meets_slo")), extrapolated=bool(entry.get("extrapolated")),
        anchor=entry.get("anchor"), confirm_gpu_hours=confirm_hours)


def recommendation_of(payload: dict[str, Any], config_map: str) -> Recommendation | None:
    rec = payload.get("recommendation")
    if not rec:
        return None
    c = candidate_of(rec)
    view = payload.get("container") or {}
    return Recommendation(**c.model_dump(), image=view.get("image", ""), args=view.get("args", []),
                          env=view.get("env", []), resources=view.get("resources", {}),
                          manifest=payload.get("manifest", ""), manifest_config_map=config_map)


def infeasible_reason(rec: Recommendation, payload: dict[str, Any], spec: TuningSpec) -> str:
    """Why the search's first candidate must not be published ('' when it may): it misses the SLO
    (the search ranks the closest miss first when no deployment meets it), or its predicted
    throughput at the SLO is zero or not a finite number. The message names the closest candidate
    and the SLO term it misses."""
    what = f"{rec.engine} {rec.precision} {rec.layout_label} x{rec.replicas} ({rec.gpus} GPUs)"
    slo = spec.objective.slo.model_dump(by_alias=True, exclude_none=True)
    terms = ", ".join(f"objective.slo.{k} {v:g}" for k, v in slo.items()) or "no SLO terms set"
    if not rec.meets_slo:
        miss = str(payload.get("slo_miss") or "") or _p90_miss(rec, spec)
        return (f"no deployment of {payload.get('candidates', 0)} candidates meets the SLO ({terms}); the closest, "
                f"{what}, misses {miss}")
    tp = rec.predicted.throughput_per_gpu  # None when the search's figure was not finite
    if tp is None or tp <= 0:
        raw = ((payload.get("recommendation") or {}).get("predicted") or {}).get("throughput_per_gpu_at_slo")
        return (f"no deployment of {payload.get('candidates', 0)} candidates serves a positive throughput within "
                f"the SLO ({terms}); the closest, {what}, predicts {raw!r} tok/s/GPU")
    return ""


def _p90_miss(rec: Recommendation, spec: TuningSpec) -> str:
    """The p90 term `rec` misses most, from its predicted figures (a payload without `slo_miss`)."""
    slo, p = spec.objective.slo, rec.predicted
    worst, words = 1.0, "the SLO"
    terms = (("TTFT p90", p.ttft_p90_ms, slo.ttft_p90_ms), ("ITL p90", p.itl_p90_ms, slo.itl_p90_ms))
    for name, value, target in terms:
        if value is not None and target and value / target > worst:
            worst, words = value / target, f"{name} {value:,.1f} ms against {target:g} ms"
    return words


def shortlist_of(payload: dict[str, Any], window_s: float) -> list[Candidate]:
    out = []
    for e in payload.get("shortlist", [])[:SHORTLIST_SIZE]:
        out.append(candidate_of(e, confirm_hours=round(e["gpus_per_replica"] * window_s / 3600.0, 4)))
    return out


def config_map_for(body: dict[str, Any], rec: Recommendation, payload: dict[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    summary = {k: v for k, v in dump(rec).items() if k != "manifest"}
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(meta["name"]), "namespace": meta["namespace"],
                     "labels": {LABEL_MANAGED: MANAGER, LABEL_TUNING: label_value(meta["name"]),
                                LABEL_KIND: "recommendation"},
                     "annotations": {"inferasim.io/generation": str(meta.get("generation", ""))}},
        "data": {
            "manifest.yaml": payload.get("manifest", ""),
            "recommendation.yaml": yaml.safe_dump(summary, sort_keys=False),
            "shortlist.yaml": yaml.safe_dump([dump(candidate_of(e)) for e in payload.get("shortlist", [])],
                                             sort_keys=False),
        },
    }
    kube_mod.own(cm, body)
    return cm


def config_map_name(tuning: str) -> str:
    return f"{tuning}-recommendation"[:253]


# --------------------------------------------------------------------------------------------
# reconcile
# --------------------------------------------------------------------------------------------

_locks: dict[str, asyncio.Lock] = {}
_last_observe: dict[str, float] = {}
_next_attempt: dict[str, float] = {}
_retuned_for: dict[str, set[str]] = {}  # ServingAnchors (name@resourceVersion) a tuning was re-tuned for
_timer_failures: dict[str, int] = {}  # consecutive timer passes that raised (their backoff), per tuning


def _lock(uid: str) -> asyncio.Lock:
    return _locks.setdefault(uid, asyncio.Lock())


def forget(uid: str) -> None:
    for d in (_locks, _last_observe, _next_attempt, _retuned_for, _timer_failures):
        d.pop(uid, None)
    metrics.forget(uid)


class Invalid(kopf.PermanentError):
    """A spec the operator cannot use: reported as a condition, never retried until it changes."""


async def _park_invalid(body: dict[str, Any], book: StatusBook, kube: Kube, message: str, *,
                        condition: tuple[str, str], event: str) -> Invalid:
    """Phase Invalid, and nothing of the last recommendation left running or published: the timer
    skips Invalid tunings, so canaries left now would hold their GPUs (and take live traffic), and
    a ConfigMap or AnalysisTemplate would keep serving a recommendation for a spec that no longer
    holds, until someone fixes the spec. Returns the exception for the caller to raise."""
    book.set(phase="Invalid", observedGeneration=book.generation, message=message, recommendation=None,
             shortlist=[])
    book.condition(condition[0], "False", condition[1], message)
    if condition[0] != "Recommended":  # the recommendation is gone too: no SpecChanged or True left behind
        book.condition("Recommended", "False", "InvalidSpec", message)
    await _withdraw_config_map(body, book, kube, config_map_name(book.name), "the spec is invalid")
    await _retire_canaries(body, book, kube, set())
    await _withdraw_analysis_template(body, book, kube)
    await book.flush()
    post_event(body, "Warning", event, message)
    return Invalid(message)


async def _observe(spec: TuningSpec, book: StatusBook, body: dict[str, Any], kube: Kube, settings: Settings,
                   has_recommendation: bool) -> tuple[dict[str, Any], ObservedWorkload | None]:
    """The workload for the search (a static workload dict) and what was observed (prometheus)."""
    if spec.workload.static is not None:
        book.condition("WorkloadObserved", "True", "StaticWorkload",
                       f"static {spec.workload.static.kind} workload from the spec")
        return spec.workload.static.model_dump(by_alias=True, mode="json", exclude_none=True), None
    assert spec.workload.prometheus is not None
    prom = spec.workload.prometheus
    if not has_recommendation:
        book.set(phase="Observing")
    await book.flush()
    try:
        observed = await asyncio.to_thread(observe, prom, "auto", timeout=settings.observe_timeout_s)
    except ObservationError as exc:
        if exc.reason == "BadSelector":
            # A label name, range or URL no Prometheus accepts: no retry fixes it, an edit of the spec
            # does (and starts a new pass).
            metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
            raise await _park_invalid(body, book, kube, f"workload not observable: {exc}; fix the spec",
                                      condition=("WorkloadObserved", exc.reason),
                                      event="WorkloadNotObservable") from None
        retries = int(book.get("retries") or 0) + 1
        delay = backoff(settings, retries)
        metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
        book.condition("WorkloadObserved", "False", exc.reason, f"{exc}; retry {retries} in {delay:.0f} s")
        book.set(retries=retries, message=f"workload not observed: {exc}")
        await book.flush()
        post_event(body, "Warning", "WorkloadNotObserved", f"{exc} (retry in {delay:.0f} s)")
        raise kopf.TemporaryError(f"workload not observed: {exc}", delay=delay) from None
    _last_observe[book.uid] = time.monotonic()
    book.condition("WorkloadObserved", "True", "MetricsAvailable", observed.describe())
    # `retries` is not reset here: it counts failed passes, and a search that fails after a good
    # observation must back off further, not start over at the first delay.
    book.set(observedWorkload=dump(observed))
    post_event(body, "Normal", "WorkloadObserved", observed.describe())
    static = observed.to_static()
    return static.model_dump(by_alias=True, mode="json", exclude_none=True), observed


async def reconcile(body: dict[str, Any], kube: Kube, settings: Settings, *, trigger: str, reason: str,
                    force: bool = False) -> str:
    """One full pass for a ServingTuning. Returns what happened (for logs and tests).

    Raises kopf.TemporaryError (retry with backoff: workload not observed, search timed out) and
    Invalid (a kopf.PermanentError: bad spec, reported as a condition)."""
    body = json.loads(json.dumps(dict(body)))  # a plain copy: kopf bodies are live views
    meta = body["metadata"]
    uid = meta.get("uid", f"{meta['namespace']}/{meta['name']}")
    async with _lock(uid):
        # A handler retried after a restart may find the work done by an earlier run.
        # Spec, status and generation are read together, inside the lock: a timer pass that captured
        # its body before a slow drift check must tune the spec of the generation it records.
        fresh = await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])
        body["spec"] = fresh.get("spec") or {}
        body["status"] = fresh.get("status") or {}
        body["metadata"]["generation"] = fresh["metadata"].get("generation")
        book = StatusBook(body, kube)
        gen = book.generation
        if not force and book.get("observedGeneration") == gen and book.get("phase") in DONE_PHASES:
            metrics.set_phase(uid, book.get("phase"))
            metrics.RECONCILES.labels(trigger=trigger, result="skipped").inc()
            return "skipped"
        try:
            result = await _reconcile(body, book, kube, settings, reason)
        except kopf.TemporaryError:
            metrics.RECONCILES.labels(trigger=trigger, result="retry").inc()
            raise
        except kopf.PermanentError:
            metrics.RECONCILES.labels(trigger=trigger, result="invalid").inc()
            raise
        except Exception as exc:  # noqa: BLE001 - every pass ends in a condition, never a bare traceback
            metrics.RECONCILES.labels(trigger=trigger, result="error").inc()
            raise await pass_failed(body, book, kube, settings, exc) from exc
        metrics.RECONCILES.labels(trigger=trigger, result=result).inc()
        return result


def _summary(exc: BaseException) -> str:
    """A short, one-line account of an exception for a condition and an Event (an ApiException's
    text is headers and a body over many lines)."""
    if isinstance(exc, ApiException):
        body = " ".join(str(exc.body or "").split())[:240]
        text = f"Kubernetes API: HTTP {exc.status} {exc.reason}" + (f": {body}" if body else "")
    else:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 400 else text[:397] + "..."


async def pass_failed(body: dict[str, Any], book: StatusBook, kube: Kube, settings: Settings,
                      exc: Exception, timer_failures: int | None = None) -> kopf.PermanentError | kopf.TemporaryError:
    """What a pass that raised becomes: a spec error parks the tuning Invalid (naming the field, as
    the spec's own check does); anything else is the operator's own failure, `Degraded=True` with a
    short summary, an Event and a metric, retried with the same growing backoff as a failed search
    (it was retried blindly every 60 s, each time at the full cost of a search, with no condition
    saying why). A timer pass (confirmation, harvest progress, drift) gives ``timer_failures``: its
    backoff counts those, and `status.retries` is left alone, since the timer re-runs a whole search
    for a tuning whose retries are above zero (and would retire the canaries being measured).
    Returns the exception for the caller to raise."""
    if isinstance(exc, SpecError):
        metrics.PASS_ERRORS.labels(kind="spec", reason="InvalidSpec").inc()
        book.discard()
        return await _park_invalid(body, book, kube, f"invalid spec: {exc}", condition=("Recommended", "InvalidSpec"),
                                   event="InvalidSpec")
    reason = ("StatusNotWritable" if isinstance(exc, StatusNotWritable) else
              "KubernetesApiError" if isinstance(exc, ApiException) else "InternalError")
    summary = _summary(exc)
    metrics.PASS_ERRORS.labels(kind="internal", reason=reason).inc()
    log.error("%s/%s: pass failed (%s)", book.namespace, book.name, summary, exc_info=exc)
    book.discard()  # half a pass is not written: the patch holds the failure only
    retries = timer_failures or int(book.get("retries") or 0) + 1
    delay = backoff(settings, retries)
    book.condition("Degraded", "True", reason, f"{summary}; retry {retries} in {delay:.0f} s")
    book.set(message=f"the last pass failed: {summary}"[:1000])
    if timer_failures is None:
        book.set(retries=retries)
    try:
        await book.flush()
    except Exception as again:  # noqa: BLE001 - the status cannot be written either: the Event and log say it
        log.error("%s/%s: cannot write the Degraded condition: %s", book.namespace, book.name, _summary(again))
    post_event(body, "Warning", "Degraded", f"{summary} (retry in {delay:.0f} s)")
    return kopf.TemporaryError(summary, delay=delay)


async def _reconcile(body: dict[str, Any], book: StatusBook, kube: Kube, settings: Settings, reason: str,
                     depth: int = 0) -> str:
    gen = book.generation
    # 1. the spec
    try:
        spec = parse_tuning_spec(body.get("spec") or {}, settings.prometheus_url)
    except SpecError as exc:
        raise await _park_invalid(body, book, kube, f"invalid spec: {exc}", condition=("Recommended", "InvalidSpec"),
                                  event="InvalidSpec") from None
    post_event(body, "Normal", "Tuning", f"tuning started: {reason}")
    has_rec = bool(book.get("recommendation"))
    if has_rec and book.get("observedGeneration") != gen:
        # The spec changed: until this pass publishes, the recommendation in status is the last
        # spec's. Say so (a pass that fails keeps it, and GitOps keeps its ConfigMap), and stop the
        # canaries that were confirming it: they judge a recommendation for a spec that no longer holds.
        book.condition("Recommended", "Unknown", "SpecChanged",
                       f"the spec changed (generation {gen}); the recommendation shown is for generation "
                       f"{book.get('observedGeneration')} until this pass completes")
        # The update handler owns the pass (and its retries) now: a handler phase keeps the timer from
        # judging canaries this pass retired, or drift against a spec still being tuned.
        book.set(phase="Searching")
        await _retire_canaries(body, book, kube, set())

    # 2. the workload
    workload, observed = await _observe(spec, book, body, kube, settings, has_rec)

    # 3. anchors: the cluster's ServingAnchors next to the shipped ones, and the live target's own
    #    passive anchor (its kernel set then needs no harvest Job)
    n_cluster = await sync_anchors(kube, settings)
    if spec.workload.prometheus is not None:
        from inferasim_operator.passive import ensure_passive_anchor

        if await ensure_passive_anchor(body, spec, book, kube, settings):
            n_cluster = await sync_anchors(kube, settings)

    # 4. the search, in a child process with a time limit
    if not has_rec:
        book.set(phase="Searching")
    book.set(message=f"searching ({reason})")
    await book.flush()
    price, p_status, p_reason, p_message = await resolve_price(spec, kube, settings)
    if p_reason == "BadPrice" and (book.cond("Priced") or {}).get("message") != p_message:
        post_event(body, "Warning", "BadPrice", p_message)
    book.condition("Priced", p_status, p_reason, p_message)
    hardware = spec.hardware.model_copy(update={"price_per_gpu_hour": price})
    tune_spec = spec.model_copy(update={"workload": WorkloadSource.model_validate({"static": workload}),
                                        "hardware": hardware})
    spec_dict = tune_spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    name = render_name(spec, book.name)
    if spec.target is not None and name != spec.target.name:
        # A Service name must be a DNS-1035 label; the target's name is not one, so the manifest
        # cannot replace the target in place: say so rather than deploy a second one silently.
        post_event(body, "Warning", "TargetNotReplaced",
                   f"target {spec.target.name!r} is not a DNS-1035 label (a Service name must be): the recommended "
                   f"manifest names its Deployment and Service {name!r}, next to the target, not in its place")
    selector = None
    if spec.target is not None and spec.target.kind == "Deployment" and name == spec.target.name:
        target = await asyncio.to_thread(kube.get_deployment, book.namespace, name)
        selector = ((target or {}).get("spec") or {}).get("selector")
    t0 = time.perf_counter()
    try:
        payload = await run_search(spec_dict, anchor_dirs(settings), name, book.namespace,
                                   stage2_top=settings.stage2_top, timeout_s=settings.search_timeout_s,
                                   target_selector=selector, tuning=book.name)
    except SearchTimeout as exc:
        metrics.SEARCH_FAILURES.labels(reason="timeout").inc()
        retries = int(book.get("retries") or 0) + 1
        delay = backoff(settings, retries)
        book.condition("Recommended", "False", "SearchTimeout", f"{exc}; retry in {delay:.0f} s")
        book.set(retries=retries, message=str(exc))
        await book.flush()
        post_event(body, "Warning", "SearchTimeout", str(exc))
        raise kopf.TemporaryError(str(exc), delay=delay) from None
    except SearchFailed as exc:
        metrics.SEARCH_FAILURES.labels(reason="invalid" if exc.invalid else "error").inc()
        if exc.invalid and observed is None:
            raise await _park_invalid(body, book, kube, f"search refused the spec: {exc}",
                                      condition=("Recommended", "InvalidSpec"), event="InvalidSpec") from None
        retries = int(book.get("retries") or 0) + 1
        if exc.invalid:
            # The workload was observed, not written: what the search refuses (a mean prompt longer
            # than the model's context, say) comes from the traffic, which an edit of the spec may not
            # fix and which may change. Retried with backoff; not parked as Invalid, where the drift
            # checks would stop for good.
            delay = backoff(settings, retries)
            why = f"the observed workload ({observed.describe()}) cannot be served as the spec asks: {exc}"
            book.condition("Recommended", "False", "WorkloadNotServable", f"{why}; retry {retries} in {delay:.0f} s")
            book.set(retries=retries, message=why[:1000])
            await book.flush()
            post_event(body, "Warning", "WorkloadNotServable", why[:500])
            raise kopf.TemporaryError(why[:500], delay=delay) from None
        delay = backoff(settings, retries)
        book.condition("Recommended", "False", "SearchFailed", str(exc)[:1000])
        book.set(retries=retries, message=str(exc)[:1000])
        await book.flush()
        post_event(body, "Warning", "SearchFailed", str(exc)[:500])
        raise kopf.TemporaryError(str(exc)[:500], delay=delay) from None
    seconds = time.perf_counter() - t0
    metrics.SEARCH_SECONDS.observe(seconds)
    post_event(body, "Normal", "SearchComplete",
               f"{payload['candidates']} candidates in {seconds:.1f} s ({payload['workload']})")

    # 5. missing anchors: harvest within the budget
    harvesting, missing, imported = await plan_harvests(body, spec, payload["missing_anchors"], book, kube, settings)
    anchors = dict(book.get("anchors") or {})
    provenance = payload.get("anchors_provenance") or {}
    anchors["used"] = [dump(AnchorRef(key=k, id=v, provenance=provenance.get(k, "")))
                       for k, v in sorted(payload["anchors_used"].items())]
    anchors["missing"] = [dump(m) for m in missing]
    anchors["harvesting"] = [dump(h) for h in harvesting]
    book.set(anchors=anchors)
    if imported and depth == 0:
        # An anchor arrived between the search and now (a Job finished while the operator was away):
        # search again with it rather than publish an unanchored result.
        await book.flush()
        return await _reconcile(body, book, kube, settings, f"{reason}; {imported} harvested anchor(s) imported",
                                depth + 1)
    if harvesting:
        book.condition("AnchorsReady", "False", "Harvesting",
                       f"{len(harvesting)} anchor(s) being harvested: " + ", ".join(h.job for h in harvesting))
    elif missing:
        book.condition("AnchorsReady", "False", "AnchorsMissing",
                       "; ".join(f"{m.engine}/{m.precision} on {m.gpu}: {m.reason}" for m in missing))
    else:
        book.condition("AnchorsReady", "True", "Available",
                       f"{len(payload['anchors_used'])} anchor(s): "
                       + ", ".join(f"{u['key']} {u.get('provenance') or 'unknown'}" for u in anchors["used"])
                       + f" ({n_cluster} in the cluster, {len(settings.anchor_dirs)} shipped folder(s))")

    # 6. the recommendation, and its ConfigMap for GitOps
    window_s = parse_duration(spec.confirmation.window, "confirmation.window") or 0.0
    cm_name = config_map_name(book.name)
    rec = recommendation_of(payload, cm_name)
    unmet = infeasible_reason(rec, payload, spec) if rec is not None else ""
    if unmet:
        # The search ranks the closest miss first when nothing meets the SLO: shown as what was
        # closest, never published (its throughput at the SLO is nil: "0 tok/s/GPU" was published).
        rec = None
    shortlist = shortlist_of(payload, window_s)
    entry = HistoryEntry(time=now_iso(), generation=gen, reason=reason[:200],
                         request_rate=observed.request_rate if observed else None)
    publish_config_map, notice = False, ""
    if rec is None:
        if unmet:
            message = unmet
        else:
            # Engine x precision pairs dropped before the search say why (ATOM on NVIDIA, fp4 for an
            # FP8 checkpoint): with no candidate left, that is the reason, not the GPU budget.
            excluded = "; ".join(f"{x['what']}: {x['why']}" for x in payload.get("excluded") or [])
            message = (f"none of {payload['candidates']} candidates fits {spec.hardware.max_gpus} GPUs"
                       + (f"; not considered: {excluded}" if excluded else ""))
        book.condition("Recommended", "False", "NoFeasibleConfig", message)
        book.set(phase="Harvesting" if harvesting else "Failed", recommendation=None, shortlist=[],
                 message=message[:1000])
        await _withdraw_config_map(body, book, kube, cm_name, "no recommendation")
        notice = message  # posted once the status saying so is written
    else:
        if payload.get("render_error"):
            rec.manifest = ""
            await _withdraw_config_map(body, book, kube, cm_name, "the recommendation cannot be rendered")
            book.condition("Recommended", "True", "NotRenderable", f"{rec.engine} {rec.layout_label}: "
                                                                   f"{payload['render_error']}")
        else:
            publish_config_map = True  # once the status holding the recommendation is written
            why = "Provisional" if harvesting else "SearchComplete"
            book.condition("Recommended", "True", why,
                           f"{rec.engine} {rec.precision} {rec.layout_label} x{rec.replicas} ({rec.gpus} GPUs): "
                           f"{_fmt(rec.predicted.throughput_per_gpu)} tok/s/GPU predicted; "
                           f"{payload['candidates']} candidates in {seconds:.1f} s"
                           + ("; anchors being harvested" if harvesting else ""))
        entry.engine, entry.layout_label, entry.gpus = rec.engine, rec.layout_label, rec.gpus
        entry.throughput_per_gpu = rec.predicted.throughput_per_gpu
        book.set(recommendation=dump(rec), shortlist=[dump(c) for c in shortlist])
    history = [dump(entry), *(book.get("history") or [])][:HISTORY_SIZE]
    book.set(history=history, lastTuneTime=now_iso(), observedGeneration=gen, retries=0,
             search={"candidates": payload["candidates"], "seconds": round(seconds, 3),
                     "workload": payload["workload"]})
    if (book.cond("Degraded") or {}).get("status") == "True":
        book.condition("Degraded", "False", "PassCompleted", "the last pass completed")

    # 7. phase, the status write, then what is published (and confirmation, once the anchors are in)
    canaries: set[str] = set()
    old_template = (book.get("confirmation") or {}).get("analysisTemplate")
    if old_template:
        book.set(confirmation=None)  # republished below by an argo-rollouts pass, else withdrawn
    if harvesting:
        book.set(phase="Harvesting", message=f"waiting for {len(harvesting)} harvest Job(s)")
    elif rec is not None:
        book.set(phase="Recommended", message=f"recommended {rec.engine} {rec.layout_label}")
    # Nothing is published (ConfigMap, event, AnalysisTemplate, canaries) before the status that
    # holds the recommendation is written: a refused status write once left a ConfigMap and a
    # Recommended event for a tuning whose status still read Searching. flush raises if refused.
    await book.flush()
    if notice:
        post_event(body, "Warning", "NoFeasibleConfig", notice)
    if rec is not None:
        if publish_config_map:
            await asyncio.to_thread(kube.apply_config_map, config_map_for(body, rec, payload))
        post_event(body, "Normal", "Recommended", f"{rec.engine} {rec.layout_label} x{rec.replicas}, "
                                                  f"{_fmt(rec.predicted.throughput_per_gpu)} tok/s/GPU; "
                                                  + (f"manifest in ConfigMap {cm_name}" if publish_config_map else
                                                     "not renderable, no manifest"))
        if not harvesting and spec.confirmation.mode != "none" and spec.confirmation.candidates > 0 and \
                not payload.get("render_error"):
            from inferasim_operator.confirm import start_confirmation

            canaries = await start_confirmation(body, spec, payload, book, kube)
    if old_template and old_template != (book.get("confirmation") or {}).get("analysisTemplate"):
        await _withdraw_analysis_template(body, book, kube, old_template)
    await _retire_canaries(body, book, kube, canaries)
    await book.flush()
    return book.get("phase") or "Recommended"


async def _withdraw_config_map(body: dict[str, Any], book: StatusBook, kube: Kube, cm_name: str, why: str) -> None:
    """Delete the recommendation's ConfigMap: the GitOps artifact must not keep serving the last
    recommendation (of another spec) when this pass has none to publish."""
    if await asyncio.to_thread(kube.delete_config_map, book.namespace, cm_name):
        post_event(body, "Normal", "RecommendationWithdrawn", f"ConfigMap {cm_name} deleted: {why}")


async def _withdraw_analysis_template(body: dict[str, Any], book: StatusBook, kube: Kube,
                                     name: str | None = None) -> None:
    """Delete the AnalysisTemplate an earlier pass published (`name`; default: the one in status):
    its thresholds are the predictions of a recommendation this pass does not stand by
    (confirmation switched off or to canaries, no recommendation, one that cannot be rendered, an
    invalid spec). Its confirmation status goes with it unless this pass wrote another."""
    conf = book.get("confirmation") or {}
    name = name or conf.get("analysisTemplate")
    if not name:
        return
    if await asyncio.to_thread(kube.delete_custom, "argoproj.io", "v1alpha1", "analysistemplates",
                               book.namespace, name):
        post_event(body, "Normal", "AnalysisTemplateWithdrawn", f"AnalysisTemplate {name} deleted")
    if conf.get("analysisTemplate") == name:
        book.set(confirmation=None)
    if "Confirmed" not in book.touched:  # a reason this pass gave (CannotMeasure, NoThresholds) stands
        book.condition("Confirmed", "Unknown", "Superseded",
                       f"AnalysisTemplate {name} withdrawn: this pass publishes no thresholds for it")


async def _retire_canaries(body: dict[str, Any], book: StatusBook, kube: Kube, keep: set[str]) -> None:
    """Delete the canaries of earlier passes that this pass does not run (their GPUs go back), and
    say that their confirmation no longer stands: a new pass (a spec change, drift, a re-tune)
    judges a new recommendation."""
    selector = f"{LABEL_KIND}=canary,{LABEL_TUNING}={label_value(book.name)}"
    gone = await asyncio.to_thread(kube.delete_deployments, book.namespace, selector, keep)
    if gone:
        post_event(body, "Normal", "CanaryRemoved", f"{', '.join(sorted(gone))}: superseded by a new pass")
    if not keep and (book.get("confirmation") or {}).get("canaries"):
        book.set(confirmation=None)
        if "Confirmed" not in book.touched:  # a reason this pass gave (CannotCanary, NoCanary) stands
            book.condition("Confirmed", "Unknown", "Superseded",
                           "a new pass superseded the earlier confirmation; this recommendation is not confirmed")


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


# --------------------------------------------------------------------------------------------
# the timer
# --------------------------------------------------------------------------------------------


async def refresh_harvests(body: dict[str, Any], book: StatusBook, kube: Kube) -> tuple[int, int, int]:
    """Update the harvest Jobs' states; import finished ones. Returns (in flight, imported, failed)."""
    anchors = dict(book.get("anchors") or {})
    out, imported, failed, active = [], 0, 0, 0
    owner = f"{book.namespace}/{book.name}"
    for h in anchors.get("harvesting") or []:
        job = await asyncio.to_thread(kube.get_job, h.get("jobNamespace") or book.namespace, h["job"])
        if job is None:
            failed += 1
            post_event(body, "Warning", "HarvestFailed", f"Job {h['job']} disappeared")
            continue
        state = job_state(job)
        if state == "Succeeded":
            try:
                anchor, _ = await import_harvest(kube, job, owner)
                imported += 1
                post_event(body, "Normal", "AnchorHarvested", f"Job {h['job']} wrote ServingAnchor "
                                                              f"{anchor_object(anchor)['metadata']['name']}")
            except MessageError as exc:
                failed += 1
                post_event(body, "Warning", "HarvestFailed", f"Job {h['job']} succeeded but {exc}")
            continue
        if state == "Failed":
            failed += 1
            _count_gpu_seconds(job, "failed")
            post_event(body, "Warning", "HarvestFailed", f"Job {h['job']}: {_job_failure(job)}")
            continue
        active += 1
        why = ""
        if state == "Running":
            # A pod the scheduler cannot place counts as active: say Pending, and why.
            why = await asyncio.to_thread(_unscheduled_reason, kube, job)
            state = "Pending" if why else state
        if h.get("state") != state or (h.get("reason") or "") != why:
            post_event(body, "Normal" if not why else "Warning",
                       "HarvestRunning" if state == "Running" else "HarvestPending",
                       f"Job {h['job']} is {state.lower()}" + (f": {why}" if why else ""))
        out.append({**h, "state": state, "reason": why})
    if out != anchors.get("harvesting"):
        anchors["harvesting"] = out
        book.set(anchors=anchors)
    return active, imported, failed


async def tick(body: dict[str, Any], kube: Kube, settings: Settings) -> str:
    """The re-tune timer: harvest progress, confirmation, schedule, drift. Returns what it did."""
    body = json.loads(json.dumps(dict(body)))
    meta = body["metadata"]
    uid = meta.get("uid", f"{meta['namespace']}/{meta['name']}")
    status = body.get("status") or {}
    phase = status.get("phase")
    if phase in (None, "Invalid", "Pending", "Observing", "Searching"):
        return "idle"  # the create/update handler owns these (and retries them with backoff)
    if time.monotonic() < _next_attempt.get(uid, 0.0):
        return "backoff"
    try:
        try:
            result = await _tick(body, uid, phase, kube, settings)
        except (kopf.TemporaryError, kopf.PermanentError):
            raise
        except Exception as exc:  # noqa: BLE001 - a timer pass ends in a condition too (reconcile's are already)
            failures = _timer_failures[uid] = _timer_failures.get(uid, 0) + 1
            async with _lock(uid):
                body, book = await fresh_book(body, kube)
                raise await pass_failed(body, book, kube, settings, exc, timer_failures=failures) from exc
        if _timer_failures.pop(uid, None):
            # The timer's pass works again: Degraded, which its failure set, is lifted.
            async with _lock(uid):
                body, book = await fresh_book(body, kube)
                if (book.cond("Degraded") or {}).get("status") == "True":
                    book.condition("Degraded", "False", "PassCompleted", "the timer's last pass completed")
                    await book.flush()
        return result
    except kopf.TemporaryError as exc:
        retries = int(((await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])).get("status")
                       or {}).get("retries") or 1)
        _next_attempt[uid] = time.monotonic() + (exc.delay or backoff(settings, retries))
        return "retry"
    except kopf.PermanentError:
        return "invalid"


async def fresh_book(body: dict[str, Any], kube: Kube) -> tuple[dict[str, Any], StatusBook]:
    """Inside the tuning's lock: the tuning as the API server has it now, and a StatusBook on it. A
    timer's body is captured before the lock; a reconcile that ran meanwhile may have moved the phase
    or the conditions, and a book on the old status would write them back (conditions are a list,
    replaced whole by the merge patch)."""
    meta = body["metadata"]
    fresh = await asyncio.to_thread(kube.get_tuning, meta["namespace"], meta["name"])
    body = {**body, "spec": fresh.get("spec") or body.get("spec") or {}, "status": fresh.get("status") or {}}
    return body, StatusBook(body, kube)


async def _tick(body: dict[str, Any], uid: str, phase: str, kube: Kube, settings: Settings) -> str:
    if phase == "Harvesting":
        async with _lock(uid):
            body, book = await fresh_book(body, kube)
            if book.get("phase") != "Harvesting":
                return "superseded"  # a reconcile moved on while this pass waited for the lock
            active, imported, failed = await refresh_harvests(body, book, kube)
            await book.flush()
        if active:
            return "harvesting"
        return await reconcile(body, kube, settings, trigger="timer", force=True,
                               reason=f"harvest finished ({imported} anchor(s), {failed} failed)")
    try:
        spec = parse_tuning_spec(body.get("spec") or {}, settings.prometheus_url)
    except SpecError:
        return "idle"
    status = body.get("status") or {}
    if phase == "Confirming":
        from inferasim_operator.confirm import confirm_progress

        async with _lock(uid):
            body, book = await fresh_book(body, kube)
            if book.get("phase") != "Confirming":
                return "superseded"
            try:
                spec = parse_tuning_spec(body.get("spec") or {}, settings.prometheus_url)
            except SpecError:
                return "idle"
            done = await confirm_progress(body, spec, book, kube, settings)
            await book.flush()
        if not done:
            return "confirming"
    if int(status.get("retries") or 0) > 0:
        # A timer-started pass (drift, schedule, new anchors) failed and tick() waited out its backoff:
        # nothing else would run it again (the drift baseline may already be the workload it failed on).
        return await reconcile(body, kube, settings, trigger="retry", force=True,
                               reason=f"retry {status.get('retries')} of a failed pass")
    every = parse_duration(spec.retune.every, "retune.every")
    age = age_s(status.get("lastTuneTime"))
    if every and age is not None and age >= every:
        return await reconcile(body, kube, settings, trigger="schedule", force=True,
                               reason=f"scheduled re-tune (every {spec.retune.every})")
    missing = (status.get("anchors") or {}).get("missing") or []
    if missing and await _missing_now_available(missing, kube, uid):
        return await reconcile(body, kube, settings, trigger="anchors", force=True, reason="new anchors available")
    if spec.workload.prometheus is not None:
        last = _last_observe.get(uid)
        if last is None or time.monotonic() - last >= settings.drift_check_seconds:
            return await _check_drift(body, uid, spec, kube, settings)
    return "steady"


async def _missing_now_available(missing: list[dict[str, Any]], kube: Kube, uid: str) -> bool:
    """Whether a ServingAnchor for one of the missing kernel sets arrived that no earlier pass of this
    tuning was re-tuned for. Anchors are read as the search reads them (an object that fails
    validation, say one written by a newer operator, is skipped there too), and each anchor
    object (name and resourceVersion) triggers at most one re-tune: one the search still does not
    match (another engine version or KV dtype) would otherwise re-tune the tuning on every tick."""
    from inferasim.catalog.engines import normalize_engine
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import resolve_model_name
    from inferasim.catalog.precision import normalize_precision

    anchors = await asyncio.to_thread(kube.list_anchors)
    have: dict[tuple[str, ...], set[str]] = {}
    for obj in anchors:
        try:
            ks = Anchor.model_validate(obj.get("spec") or {}).kernel_set
            key = (normalize_engine(ks.engine), resolve_model_name(ks.model), get_gpu(ks.gpu).name,
                   normalize_precision(ks.precision or "auto"))
        except ValueError:
            continue
        meta = obj.get("metadata") or {}
        have.setdefault(key, set()).add(f"{meta.get('name')}@{meta.get('resourceVersion', '')}")
    seen = _retuned_for.setdefault(uid, set())
    for m in missing:
        try:
            key = (normalize_engine(m["engine"]), resolve_model_name(m["model"]), get_gpu(m["gpu"]).name,
                   m["precision"])
        except (KeyError, ValueError):
            continue
        new = have.get(key, set()) - seen
        if new:
            seen |= new
            return True
    return False


async def _check_drift(body: dict[str, Any], uid: str, spec: TuningSpec, kube: Kube, settings: Settings) -> str:
    assert spec.workload.prometheus is not None
    _last_observe[uid] = time.monotonic()
    baseline = (body.get("status") or {}).get("observedWorkload")
    try:
        now = await asyncio.to_thread(observe, spec.workload.prometheus, "auto", timeout=settings.observe_timeout_s)
    except ObservationError as exc:
        async with _lock(uid):
            body, book = await fresh_book(body, kube)
            metrics.OBSERVE_FAILURES.labels(reason=exc.reason).inc()
            book.condition("WorkloadObserved", "False", exc.reason, str(exc))
            await book.flush()
        post_event(body, "Warning", "WorkloadNotObserved", str(exc))
        return "observe-failed"
    if not baseline:
        return await reconcile(body, kube, settings, trigger="drift", force=True, reason="no baseline workload")
    moved = drift(baseline, now)
    if moved >= spec.retune.drift_threshold:
        post_event(body, "Normal", "WorkloadDrifted",
                   f"the workload moved {moved:.0%} (threshold {spec.retune.drift_threshold:.0%}): {now.describe()}")
        return await reconcile(body, kube, settings, trigger="drift", force=True,
                               reason=f"workload drifted {moved:.0%}")
    cond = next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "WorkloadObserved"),
                None)
    if cond and cond.get("status") != "True":
        async with _lock(uid):
            body, book = await fresh_book(body, kube)
            book.condition("WorkloadObserved", "True", "MetricsAvailable", now.describe())
            await book.flush()
    # The workload is steady: is the running configuration still what its anchors predict?
    from inferasim_operator.passive import check_prediction

    done = await check_prediction(body, uid, spec, kube, settings)
    return done if not done.startswith("prediction: ") else f"steady (drift {moved:.0%}; {done})"
