"""The operator's settings, grouped by concern (as kopf's own OperatorSettings are).

Every value comes from an INFERASIM_* environment variable (the Helm chart sets them) with the
default shown here; :meth:`Settings.from_env` refuses a bad value with a ValueError naming the
variable, so a misconfigured operator stops at start-up rather than mid-pass.

    settings.anchors.dirs      INFERASIM_ANCHOR_DIRS          shipped anchor folders (os.pathsep-separated)
    settings.anchors.cache     INFERASIM_ANCHOR_CACHE         where cluster ServingAnchors are written for the search
    settings.timer.interval_s  INFERASIM_TIMER_SECONDS        the re-tune timer's period
    settings.timer.drift_check_s  INFERASIM_DRIFT_CHECK_SECONDS  how often the timer observes for drift
    settings.search.timeout_s  INFERASIM_SEARCH_TIMEOUT_S     one search's time limit (child process)
    settings.search.stage2_top INFERASIM_STAGE2_TOP           candidates simulated in the search's stage 2
    settings.search.workers    INFERASIM_SEARCH_WORKERS       searches run at once (0: the CPUs, cgroup quota included)
    settings.search.burst_stage2_top  INFERASIM_SEARCH_BURST_STAGE2_TOP  stage 2 under a burst (0: never shortened)
    settings.search.max_failures  INFERASIM_SEARCH_MAX_FAILURES  failed searches in a row before giving up
    settings.harvest.image     INFERASIM_HARVESTER_IMAGE      the harvester container's image
    settings.harvest.extra_args  INFERASIM_HARVEST_ARGS       extra `inferasim harvest run` arguments
    settings.harvest.engine_images  INFERASIM_ENGINE_IMAGES   VENDOR/ENGINE=IMAGE,...
    settings.observe.prometheus_url  INFERASIM_PROMETHEUS_URL  Prometheus of specs that name none
    settings.observe.timeout_s INFERASIM_OBSERVE_TIMEOUT_S    one Prometheus query's time limit
    settings.backoff.base_s / max_s  INFERASIM_BACKOFF_BASE_S / _MAX_S  retries of failed passes
    settings.prices.config_map INFERASIM_PRICE_CONFIGMAP      GPU prices ConfigMap ('' for none)
    settings.prices.namespace  INFERASIM_OPERATOR_NAMESPACE   the operator's namespace, which holds it
    settings.passive.window_s / step_s  INFERASIM_PASSIVE_WINDOW_S / _STEP_S  passive anchor fits
    settings.prediction.window_s  INFERASIM_PREDICTION_WINDOW_S  the prediction-error check's range
    settings.prediction.engine_speedup  INFERASIM_ENGINE_SPEEDUP  engine seconds per wall second

The flat names the settings had before they were grouped (`settings.timer_seconds`,
`Settings(stage2_top=2)`) still read and write the grouped fields: tests and scripts build
settings that way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _default_anchor_dirs() -> list[str]:
    # A source checkout's anchors/ folder, else the image's.
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "anchors", Path("/app/anchors")):
        if candidate.is_dir():
            return [str(candidate)]
    return []


@dataclass
class AnchorSettings:
    """Where the search reads anchors: the shipped folders and a cache of the cluster's ServingAnchors."""

    dirs: list[str] = field(default_factory=_default_anchor_dirs)
    cache: str = "/tmp/inferasim-anchors"


@dataclass
class TimerSettings:
    """The re-tune timer (kopf registers its period at import) and its drift checks."""

    interval_s: float = 30.0
    drift_check_s: float = 300.0


@dataclass
class SearchSettings:
    """The search, run in a child process."""

    timeout_s: float = 300.0
    stage2_top: int = 50
    # The bounded pool (search_pool.py): 0 sizes it to the CPUs this process may use.
    workers: int = 0
    # After this many failed searches in a row (timeouts, errors inside the library) a tuning is
    # Failed until its spec changes (each failure backs off first); a search that ran past its limit
    # was retried forever at full cost.
    max_failures: int = 3
    # Under a burst (twice as many searches waiting as run at once) a search simulates this many
    # candidates in stage 2 instead of stage2_top: Recommended soon (the status says quick), then
    # refined with the full stage 2 in the background once the queue is empty. 0: never shortened.
    burst_stage2_top: int = 3


@dataclass
class HarvestSettings:
    """Harvest Jobs."""

    image: str = "inferasim-operator:0.1.0"
    extra_args: list[str] = field(default_factory=list)
    # Engine images per (GPU vendor, engine) where a tuning's harvest.images names none (chart:
    # engineImages); otherwise the catalog's image for the GPU.
    engine_images: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass
class ObserveSettings:
    """Reading workloads from Prometheus."""

    # Prometheus of tunings whose spec leaves workload.prometheus.url empty (chart: prometheus.url).
    prometheus_url: str = ""
    timeout_s: float = 10.0


@dataclass
class BackoffSettings:
    """Retries of a failed observation, search or pass: base_s, doubling, at most max_s."""

    base_s: float = 10.0
    max_s: float = 600.0


@dataclass
class PriceSettings:
    """GPU prices ($/GPU-hour per GPU type) for tunings whose spec gives none."""

    config_map: str = "inferasim-gpu-prices"
    namespace: str = "inferasim-system"  # the operator's own namespace, which holds the ConfigMap


@dataclass
class PassiveSettings:
    """Passive anchors: the range of the target's series fitted, one window per step."""

    window_s: float = 3600.0
    step_s: float = 60.0


@dataclass
class PredictionSettings:
    """The prediction-error check at each drift check."""

    window_s: float = 300.0  # the recent range compared with the prediction
    # Engine seconds per wall second: 1 for real engines; an emulator's --speedup where emulators
    # play the engines (their histograms record engine seconds, Prometheus rates are per wall second).
    engine_speedup: float = 1.0


class FlatName:
    """A flat name of a grouped setting: `settings.timer_seconds` is `settings.timer.interval_s`."""

    def __init__(self, group: str, name: str) -> None:
        self.group, self.name = group, name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.group), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(getattr(obj, self.group), self.name, value)


@dataclass(init=False)
class Settings:
    """Operator settings, from INFERASIM_* environment variables (the chart sets them)."""

    anchors: AnchorSettings
    timer: TimerSettings
    search: SearchSettings
    harvest: HarvestSettings
    observe: ObserveSettings
    backoff: BackoffSettings
    prices: PriceSettings
    passive: PassiveSettings
    prediction: PredictionSettings

    # The flat names, as keywords of Settings(...) and as attributes.
    anchor_dirs = FlatName("anchors", "dirs")
    anchor_cache = FlatName("anchors", "cache")
    timer_seconds = FlatName("timer", "interval_s")
    drift_check_seconds = FlatName("timer", "drift_check_s")
    search_timeout_s = FlatName("search", "timeout_s")
    stage2_top = FlatName("search", "stage2_top")
    search_workers = FlatName("search", "workers")
    harvester_image = FlatName("harvest", "image")
    harvest_extra_args = FlatName("harvest", "extra_args")
    engine_images = FlatName("harvest", "engine_images")
    prometheus_url = FlatName("observe", "prometheus_url")
    observe_timeout_s = FlatName("observe", "timeout_s")
    backoff_base_s = FlatName("backoff", "base_s")
    backoff_max_s = FlatName("backoff", "max_s")
    price_config_map = FlatName("prices", "config_map")
    operator_namespace = FlatName("prices", "namespace")
    passive_window_s = FlatName("passive", "window_s")
    passive_step_s = FlatName("passive", "step_s")
    prediction_window_s = FlatName("prediction", "window_s")
    engine_speedup = FlatName("prediction", "engine_speedup")

    def __init__(self, *, anchors: AnchorSettings | None = None, timer: TimerSettings | None = None,
                 search: SearchSettings | None = None, harvest: HarvestSettings | None = None,
                 observe: ObserveSettings | None = None, backoff: BackoffSettings | None = None,
                 prices: PriceSettings | None = None, passive: PassiveSettings | None = None,
                 prediction: PredictionSettings | None = None, **flat: Any) -> None:
        self.anchors = anchors or AnchorSettings()
        self.timer = timer or TimerSettings()
        self.search = search or SearchSettings()
        self.harvest = harvest or HarvestSettings()
        self.observe = observe or ObserveSettings()
        self.backoff = backoff or BackoffSettings()
        self.prices = prices or PriceSettings()
        self.passive = passive or PassiveSettings()
        self.prediction = prediction or PredictionSettings()
        for key, value in flat.items():
            if not isinstance(vars(Settings).get(key), FlatName):
                raise TypeError(f"Settings() got an unexpected keyword argument {key!r}")
            setattr(self, key, value)

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

        # Read in the order they always were: the first bad variable is the one reported.
        if env.get("INFERASIM_ANCHOR_DIRS") is not None:
            s.anchors.dirs = [d for d in env["INFERASIM_ANCHOR_DIRS"].split(os.pathsep) if d]
        s.anchors.cache = env.get("INFERASIM_ANCHOR_CACHE") or s.anchors.cache
        s.timer.interval_s = num("INFERASIM_TIMER_SECONDS", s.timer.interval_s, 0.5)
        s.timer.drift_check_s = num("INFERASIM_DRIFT_CHECK_SECONDS", s.timer.drift_check_s, 0.5)
        s.search.timeout_s = num("INFERASIM_SEARCH_TIMEOUT_S", s.search.timeout_s, 1)
        s.search.stage2_top = int(num("INFERASIM_STAGE2_TOP", s.search.stage2_top, 0))
        s.search.workers = int(num("INFERASIM_SEARCH_WORKERS", s.search.workers, 0))
        s.search.burst_stage2_top = int(num("INFERASIM_SEARCH_BURST_STAGE2_TOP", s.search.burst_stage2_top, 0))
        s.search.max_failures = int(num("INFERASIM_SEARCH_MAX_FAILURES", s.search.max_failures, 1))
        s.harvest.image = env.get("INFERASIM_HARVESTER_IMAGE") or s.harvest.image
        s.harvest.extra_args = (env.get("INFERASIM_HARVEST_ARGS") or "").split()
        s.observe.timeout_s = num("INFERASIM_OBSERVE_TIMEOUT_S", s.observe.timeout_s, 0.1)
        s.backoff.base_s = num("INFERASIM_BACKOFF_BASE_S", s.backoff.base_s, 0.1)
        s.backoff.max_s = num("INFERASIM_BACKOFF_MAX_S", s.backoff.max_s, s.backoff.base_s)
        s.prices.config_map = env.get("INFERASIM_PRICE_CONFIGMAP", s.prices.config_map)
        s.observe.prometheus_url = env.get("INFERASIM_PROMETHEUS_URL", s.observe.prometheus_url).strip()
        s.harvest.engine_images = parse_engine_images(env.get("INFERASIM_ENGINE_IMAGES", ""))
        s.prices.namespace = env.get("INFERASIM_OPERATOR_NAMESPACE") or s.prices.namespace
        s.passive.step_s = num("INFERASIM_PASSIVE_STEP_S", s.passive.step_s, 1)
        # A fit needs at least three windows.
        s.passive.window_s = num("INFERASIM_PASSIVE_WINDOW_S", s.passive.window_s, 3 * s.passive.step_s)
        s.prediction.window_s = num("INFERASIM_PREDICTION_WINDOW_S", s.prediction.window_s, 1)
        s.prediction.engine_speedup = num("INFERASIM_ENGINE_SPEEDUP", s.prediction.engine_speedup, 1e-6)
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
    return min(settings.backoff.base_s * 2 ** min(max(retries - 1, 0), 32), settings.backoff.max_s)
