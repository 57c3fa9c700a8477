"""Render a serving configuration as Kubernetes manifests (plain dicts, YAML-dumpable).

One :class:`ServingConfig` (engine, model, GPU, layout, scheduler and memory knobs) becomes an
``apps/v1`` Deployment running the engine's OpenAI-compatible server plus a ClusterIP Service on
its HTTP port. The library never imports ``kubernetes`` or ``kopf``: the operator applies the
dicts, the CLI prints them with :func:`to_yaml`.

Every engine argument is taken from the engine catalogue (:mod:`inferasim.catalog.engines`) and
checked with :func:`~inferasim.catalog.engines.is_known_flag` before it is emitted; an unknown
flag (from the mapping below or from ``extra_args``) raises ValueError naming it. Source tags in
the comments are those of ``shared/notes/engine-facts.md`` section 0:

* ``V10`` ROCm/vllm (v0.10.1 line) ``vllm/engine/arg_utils.py``, ``vllm/envs.py``
* ``S``   sgl-project/sglang ``python/sglang/srt/server_args.py``
* ``A``   ROCm/ATOM ``atom/model_engine/arg_utils.py``, ``atom/entrypoints/openai/api_server.py``
* ``I``   SemiAnalysisAI/InferenceX configs (flags and env used in practice)
* ``K``/``N`` AMD / NVIDIA device-plugin node labels (section 6)

Facts read outside the notes say so ("not in the notes").

Scope: one replica must fit on one node (``layout.gpus <= gpus_per_node``). Multi-node replicas
need LeaderWorkerSet or Ray and are refused with a ValueError. For P/D disaggregation
(``disagg_role``) this renders one pool; the router/proxy in front of the pools (vLLM proxy,
sglang-router, ATOM ``atomesh``) is not rendered.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferasim.catalog.checkpoints import names_quantized_checkpoint, precision_error
from inferasim.catalog.engines import (
    DEFAULT_HOST,
    SGLANG_MAX_PREFILL_TOKENS,
    default_image,
    default_port,
    engine_flags,
    flag_for,
    is_known_flag,
    launch_command,
    model_flag,
    normalize_engine,
)
from inferasim.catalog.gpus import GPU, get_gpu
from inferasim.catalog.models import get_model
from inferasim.catalog.precision import PRECISIONS
from inferasim.core.layout import Layout

__all__ = [
    "ANNOTATION_FP8_KERNELS",
    "ANNOTATION_PD_ROUTER",
    "DISAGG_ROLES",
    "HF_HOME",
    "LABEL_ENGINE",
    "LABEL_LAYOUT",
    "LABEL_NAME",
    "SPEC_METHODS",
    "ServingConfig",
    "engine_args",
    "engine_env",
    "gpu_node_label",
    "gpu_node_placement",
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
_PRODUCT_LABEL_KEY: dict[str, str] = {
    "amd": "amd.com/gpu.product-name",
    "nvidia": "nvidia.com/gpu.product",
}

# Hugging Face cache inside the container (an emptyDir; swap for a PVC to keep weights across
# restarts). HF_HOME is the huggingface_hub cache root.
HF_HOME = "/root/.cache/huggingface"
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

# Speculative decoding methods and their per-engine spellings.
SPEC_METHODS: tuple[str, ...] = ("none", "eagle", "eagle3", "mtp", "ngram")
_SPEC_SPELLING: dict[str, dict[str, str]] = {
    # V10 --speculative-config {"method": ...}; "mtp" is the generic name of newer vLLM (older
    # releases used "deepseek_mtp"); the value list is unverified in the notes (5.1).
    "vllm": {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram"},
    # S --speculative-algorithm EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM (notes 5.2).
    "sglang": {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "ngram": "NGRAM"},
    # A --method mtp | eagle3 | dspark (notes 5.3).
    "atom": {"eagle3": "eagle3", "mtp": "mtp"},
}
_SPEC_NEEDS_DRAFT = frozenset({"eagle", "eagle3"})

DISAGG_ROLES: tuple[str, ...] = ("prefill", "decode")

# KV-cache dtype: ServingConfig spelling -> engine value (None: leave the engine default).
_KV_DTYPES: dict[str, dict[str, str | None]] = {
    # V10 --kv-cache-dtype auto | fp8 | fp8_e4m3 | fp8_e5m2 | fp8_inc; "auto" is the model dtype,
    # so a bf16 request needs no flag.
    "vllm": {
        "auto": None,
        "bf16": None,
        "bfloat16": None,
        "fp8": "fp8",
        "fp8_e4m3": "fp8_e4m3",
        "fp8_e5m2": "fp8_e5m2",
        "fp8_inc": "fp8_inc",
    },
    # S --kv-cache-dtype auto | fp8_e5m2 | fp8_e4m3 | bf16 | ... (SGLang has no bare "fp8").
    "sglang": {
        "auto": None,
        "bf16": "bf16",
        "bfloat16": "bf16",
        "fp8": "fp8_e4m3",
        "fp8_e4m3": "fp8_e4m3",
        "fp8_e5m2": "fp8_e5m2",
    },
    # A --kv_cache_dtype bf16 (default) | fp8.
    "atom": {"auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8"},
}

# P/D disaggregation: KV-transfer settings per engine and role.
_VLLM_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}  # notes 5.1 example (names unverified)
# ATOM recipes (not in the notes): mooncake connector, producer on prefill, consumer on decode,
# handshake port 6301 (the default in notes 5.3).
_ATOM_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
_ATOM_HANDSHAKE_PORT = 6301

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VERSION_TAG = re.compile(r"^v\d+(\.\d+)*")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingConfig:
    """One serving deployment: engine, model, hardware, layout and engine knobs.

    ``None`` for a knob leaves the engine's own default (no flag is rendered). ``engine`` is
    normalised to its canonical name ("vllm", "sglang", "atom") on construction. Field errors raise
    ValueError naming the field and the accepted values.
    """

    engine: str
    model: str
    gpu: str
    layout: Layout
    replicas: int = 1
    precision: str = "auto"
    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    memory_fraction: float | None = None
    spec_method: str = "none"
    num_speculative_tokens: int = 0
    max_model_len: int | None = None
    image: str | None = None
    engine_version: str = ""
    disagg_role: str | None = None
    extra_args: tuple[str, ...] = ()
    draft_model: str | None = None  # draft checkpoint for eagle / eagle3 speculative decoding

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", normalize_engine(self.engine))
        if not isinstance(self.layout, Layout):
            raise ValueError(f"layout must be an inferasim.core.layout.Layout, got {type(self.layout).__name__}")
        if not isinstance(self.model, str) or not self.model.strip() or self.model.startswith("-"):
            raise ValueError(f"model must be a Hugging Face id or path, got {self.model!r}")
        if any(c.isspace() for c in self.model):
            raise ValueError(f"model must not contain whitespace, got {self.model!r}")
        gpu = get_gpu(self.gpu)  # UnknownGPUError (a ValueError) lists the accepted names
        if self.engine == "atom" and gpu.vendor != "amd":
            raise ValueError(
                f"ATOM is ROCm-only (AMD Instinct GPUs); gpu={self.gpu!r} is an NVIDIA GPU. "
                "Use engine vllm or sglang on NVIDIA GPUs."
            )
        _check_int(self.replicas, "replicas", minimum=1)
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value is not None:
                _check_int(value, name, minimum=1)
        for name in ("chunked_prefill", "prefix_caching"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true, false or None (engine default), got {value!r}")
        if self.memory_fraction is not None:
            mf = self.memory_fraction
            if isinstance(mf, bool) or not isinstance(mf, int | float) or not 0 < mf <= 1:
                raise ValueError(
                    f"memory_fraction must be a number in (0, 1] (the engine's gpu_memory_utilization / "
                    f"mem_fraction_static), got {mf!r}"
                )
        if _norm(self.precision) not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not accepted; accepted: {', '.join(PRECISIONS)}")
        kv_map = _KV_DTYPES[self.engine]
        if _norm(self.kv_cache_dtype) not in kv_map:
            raise ValueError(
                f"kv_cache_dtype={self.kv_cache_dtype!r} is not accepted for {self.engine}; "
                f"accepted: {', '.join(kv_map)}"
            )
        self._check_spec()
        if self.disagg_role is not None and self.disagg_role not in DISAGG_ROLES:
            raise ValueError(
                f"disagg_role={self.disagg_role!r} is not accepted; accepted: None, {', '.join(DISAGG_ROLES)}"
            )
        if isinstance(self.extra_args, list):  # e.g. from YAML / pydantic; keep the config hashable
            object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not isinstance(self.extra_args, tuple) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"extra_args must be a tuple of strings, got {self.extra_args!r}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise ValueError(f"image must be a non-empty image reference or None, got {self.image!r}")

    def _check_spec(self) -> None:
        method = _norm(self.spec_method)
        if method not in SPEC_METHODS:
            raise ValueError(f"spec_method={self.spec_method!r} is not accepted; accepted: {', '.join(SPEC_METHODS)}")
        _check_int(self.num_speculative_tokens, "num_speculative_tokens", minimum=0)
        if method == "none":
            if self.num_speculative_tokens:
                raise ValueError(
                    f"num_speculative_tokens={self.num_speculative_tokens} needs spec_method "
                    f"({', '.join(SPEC_METHODS[1:])}); spec_method is 'none'"
                )
            return
        supported = _SPEC_SPELLING[self.engine]
        if method not in supported:
            raise ValueError(
                f"spec_method={self.spec_method!r} is not supported by {self.engine}; "
                f"accepted: none, {', '.join(supported)}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"spec_method={method} needs num_speculative_tokens >= 1, got {self.num_speculative_tokens}"
            )
        if method in _SPEC_NEEDS_DRAFT and not self.draft_model:
            raise ValueError(f"spec_method={method} needs draft_model (the draft checkpoint's Hugging Face id)")

    @property
    def gpu_spec(self) -> GPU:
        return get_gpu(self.gpu)

    @property
    def gpus_per_replica(self) -> int:
        return self.layout.gpus


def _check_int(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _norm(value: str) -> str:
    return str(value).strip().lower().replace("-", "_") if value is not None else ""


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


def _is_flag_token(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token)


def _alias_map(engine: str) -> dict[str, str]:
    """Catalogued alias -> canonical flag ("-tp" -> "--tensor-parallel-size"), from the help texts."""
    out: dict[str, str] = {}
    for name, flag in engine_flags(engine).items():
        m = re.search(r"(?:alias|abbreviation) of (--?[A-Za-z][\w-]*)", flag.help)
        if m:
            out[name] = m.group(1)
    return out


def flag_spelling(engine: str, flag: str, aliases: dict[str, str]) -> str:
    """The engine's own spelling of `flag`: aliases resolved, ATOM snake->kebab (negations kept:
    `inferasim.deployment` reads --no-X and --X apart)."""
    if engine == "atom" and flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")  # A: FlexibleArgumentParser accepts both spellings
    return aliases.get(flag, flag)


def _canonical(engine: str, flag: str, aliases: dict[str, str]) -> str:
    """Canonical name used to detect duplicates: the engine's spelling with negations folded."""
    key = flag_spelling(engine, flag.split("=", 1)[0], aliases)
    if key.startswith("--no-"):
        key = "--" + key[5:]  # --no-enable-prefix-caching conflicts with --enable-prefix-caching
    return key


def _role(engine: str, role: str) -> str:
    flag = flag_for(engine, role)
    if flag is None:  # pragma: no cover - guarded by the callers
        raise ValueError(f"{engine} has no catalogued flag for {role!r}")
    return flag


class _Args:
    """Accumulates ``flag [value]`` pairs, checking each flag against the engine catalogue."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.flags = engine_flags(engine)
        self.aliases = _alias_map(engine)
        self.tokens: list[str] = []
        self.seen: dict[str, str] = {}

    def add(self, flag: str, value: object = None, *, origin: str = "rendered") -> None:
        if not is_known_flag(self.engine, flag):
            raise ValueError(
                f"{flag!r} ({origin}) is not a known {self.engine} flag; see "
                f"inferasim.catalog.engines.engine_flags({self.engine!r})"
            )
        canon = _canonical(self.engine, flag, self.aliases)
        if canon in self.seen:
            raise ValueError(
                f"{self.engine} flag {flag!r} ({origin}) duplicates {self.seen[canon]!r}, which is already set"
            )
        self.seen[canon] = flag
        self.tokens.append(flag)
        if value is not None:
            self.tokens.append(str(value))

    def add_extra(self, extra: tuple[str, ...]) -> None:
        """Pass ``extra_args`` through: each flag must be catalogued, values must follow their flag."""
        i = 0
        while i < len(extra):
            token = extra[i]
            if not _is_flag_token(token):
                raise ValueError(
                    f"extra_args: {token!r} is not preceded by a flag that takes a value; extra_args hold "
                    "'--flag value' pairs and bare boolean flags"
                )
            key = token.split("=", 1)[0]
            if not is_known_flag(self.engine, key):
                raise ValueError(
                    f"extra_args: {key!r} is not a known {self.engine} flag; see "
                    f"inferasim.catalog.engines.engine_flags({self.engine!r})"
                )
            spec = self.flags.get(_canonical_lookup(self.engine, key))
            takes_value = spec.takes_value if spec is not None else False
            if "=" in token:
                if not takes_value:
                    raise ValueError(f"extra_args: {key!r} is a boolean flag and takes no value")
                self._add_raw(token, key)
                i += 1
                continue
            if takes_value:
                if i + 1 >= len(extra) or _is_flag_token(extra[i + 1]):
                    raise ValueError(f"extra_args: {key!r} needs a value")
                self._add_raw(token, key)
                self.tokens.append(extra[i + 1])
                i += 2
            else:
                self._add_raw(token, key)
                i += 1

    def _add_raw(self, token: str, key: str) -> None:
        canon = _canonical(self.engine, key, self.aliases)
        if canon in self.seen:
            raise ValueError(
                f"extra_args: {key!r} duplicates {self.seen[canon]!r}, which the renderer already sets "
                "from the ServingConfig fields; set the field instead"
            )
        self.seen[canon] = key
        self.tokens.append(token)


def _canonical_lookup(engine: str, key: str) -> str:
    """Catalogue key of ``key`` (ATOM snake spellings map to the kebab entries)."""
    if engine == "atom" and key.startswith("--"):
        return "--" + key[2:].replace("_", "-")
    return key


# --------------------------------------------------------------------------------------------------
# Engine arguments and environment
# --------------------------------------------------------------------------------------------------


def _check_fits_node(cfg: ServingConfig, gpu: GPU) -> None:
    lay = cfg.layout
    if lay.gpus > gpu.gpus_per_node:
        raise ValueError(
            f"layout tp={lay.tp} x pp={lay.pp} x dp={lay.dp} = {lay.gpus} GPUs per replica exceeds "
            f"gpus_per_node={gpu.gpus_per_node} of {gpu.name}: multi-node serving needs LeaderWorkerSet / Ray "
            "and is not rendered; choose layout.tp, layout.pp and layout.dp with tp*pp*dp <= "
            f"{gpu.gpus_per_node}, and scale out with replicas"
        )


def _parallel_args(cfg: ServingConfig, args: _Args) -> None:
    lay = cfg.layout
    eng = cfg.engine
    if eng == "vllm":
        # V10 arg_utils: --tensor-parallel-size / --pipeline-parallel-size / --data-parallel-size;
        # --enable-expert-parallel shards the experts over TP x DP (notes 5.1), so EP width = tp*dp.
        if lay.moe_ep not in (1, lay.tp * lay.dp):
            raise ValueError(
                f"vLLM expert parallel shards experts over all tp x dp = {lay.tp * lay.dp} GPUs: layout.moe_ep "
                f"must be 1 or {lay.tp * lay.dp}, got {lay.moe_ep}"
            )
        args.add(_role(eng, "tensor_parallel"), lay.tp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"))
    elif eng == "sglang":
        # S server_args: under --enable-dp-attention, --tp-size spans all attention-DP ranks
        # (attention TP = tp_size / dp_size), so --tp-size = tp*dp; --ep-size divides it.
        args.add(_role(eng, "tensor_parallel"), lay.tp * lay.dp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
            args.add(_role(eng, "dp_attention"))
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"), lay.moe_ep)
    else:
        # A arg_utils: -tp / -pp / -dp, --enable-expert-parallel, --enable-dp-attention.
        # ATOM's FusedMoEParallelConfig (atom/model_ops/moe.py, not in the notes) flattens DP into the
        # MoE group only under --enable-dp-attention, and its CoreManager then runs every rank with
        # attention TP 1 (docs/distributed_guide.md, not in the notes). So: EP over tp GPUs (dp == 1),
        # or EP over dp GPUs with attention TP 1 (tp == 1); tp > 1 and dp > 1 with EP has no ATOM form
        # that matches the layout.
        if lay.moe_ep > 1:
            if lay.dp == 1 and lay.moe_ep != lay.tp:
                raise ValueError(
                    f"ATOM expert parallel spans the tp={lay.tp} GPUs of one engine: layout.moe_ep must be 1 or "
                    f"{lay.tp}, got {lay.moe_ep}"
                )
            if lay.dp > 1 and lay.tp == 1 and lay.moe_ep != lay.dp:
                raise ValueError(
                    f"ATOM expert parallel under DP attention spans all dp={lay.dp} ranks: layout.moe_ep must be 1 "
                    f"or {lay.dp}, got {lay.moe_ep}"
                )
            if lay.dp > 1 and lay.tp > 1:
                raise ValueError(
                    f"ATOM cannot render layout tp={lay.tp}, dp={lay.dp}, moe_ep={lay.moe_ep}: with "
                    "--enable-dp-attention ATOM runs attention at TP 1 over tp*dp ranks, without it the experts "
                    "stay inside each DP rank. Use layout.tp=1, layout.dp=N, layout.moe_ep=N (DP attention + EP) "
                    "or layout.dp=1, layout.moe_ep=layout.tp"
                )
        args.add(_role(eng, "tensor_parallel"), lay.tp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
            if lay.moe_ep > 1:
                args.add(_role(eng, "dp_attention"))
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"))


def _online_fp8(cfg: ServingConfig) -> bool:
    return _norm(cfg.precision) == "fp8" and not names_quantized_checkpoint(cfg.model)


# Annotation of a manifest whose online FP8 runs other kernels than the price assumed.
ANNOTATION_FP8_KERNELS = "inferasim.io/fp8-kernels"
# Annotation of a P/D pool: the router in front of the pools is not rendered (module docstring).
ANNOTATION_PD_ROUTER = "inferasim.io/pd-router"
_PD_ROUTER = {
    "vllm": "vLLM's disaggregated-serving proxy or llm-d",  # not in the notes
    "sglang": "sglang_router.launch_router --pd-disaggregation",  # not in the notes
    "atom": "ATOM's atomesh",  # as in the module docstring; not in the notes
}


def fp8_kernels_note(cfg: ServingConfig) -> str | None:
    """What to know when ``cfg`` quantizes a 16-bit checkpoint online to FP8 (per tensor) while the
    predictor prices the model's family at block-scaled FP8 (catalog.models.FP8_BLOCK_FAMILIES: the
    kernels of its published FP8 checkpoint, which measured data cover). None when they agree."""
    if not _online_fp8(cfg):
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


def _quantization_args(cfg: ServingConfig, args: _Args) -> None:
    # Quantised checkpoints (FP8/FP4/INT4/AWQ/GPTQ ...) carry their scheme in config.json and every
    # engine detects it; the only precision that needs a flag is online FP8 of a 16-bit checkpoint:
    # vLLM --quantization fp8 (V10), SGLang --quantization fp8 (S). ATOM has no catalogued
    # quantization flag: precision fp8/fp4 on ATOM needs a pre-quantised checkpoint.
    if not _online_fp8(cfg):
        return
    flag = flag_for(cfg.engine, "quantization")
    if flag is not None:
        args.add(flag, "fp8")


def _scheduler_args(cfg: ServingConfig, args: _Args) -> None:
    eng = cfg.engine
    if cfg.max_num_seqs is not None:
        # V10 / A --max-num-seqs; S --max-running-requests
        args.add(_role(eng, "max_num_seqs"), cfg.max_num_seqs)
    if eng == "sglang":
        # S: --chunked-prefill-size is SGLang's token budget per prefill chunk (-1 disables chunking);
        # --max-prefill-tokens (16384) bounds one prefill batch.
        if cfg.chunked_prefill is False:
            args.add(_role(eng, "max_num_batched_tokens"), -1)
            if cfg.max_num_batched_tokens is not None:
                args.add(_role(eng, "max_prefill_tokens"), cfg.max_num_batched_tokens)
        elif cfg.max_num_batched_tokens is not None:
            args.add(_role(eng, "max_num_batched_tokens"), cfg.max_num_batched_tokens)
            if cfg.max_num_batched_tokens > SGLANG_MAX_PREFILL_TOKENS:
                args.add(_role(eng, "max_prefill_tokens"), cfg.max_num_batched_tokens)
    else:
        if cfg.max_num_batched_tokens is not None:
            args.add(_role(eng, "max_num_batched_tokens"), cfg.max_num_batched_tokens)  # V10 / A
        if cfg.chunked_prefill is True:
            args.add(_role(eng, "enable_chunked_prefill"))  # V10 / A --enable-chunked-prefill
        elif cfg.chunked_prefill is False:
            if eng == "atom":
                # A defines --no-enable_chunked_prefill (BooleanOptionalAction), but the catalogue does not
                # list it, and only catalogued flags are rendered.
                raise ValueError(
                    "chunked_prefill=False cannot be rendered for atom: its negation flag is not in the engine "
                    "catalogue; leave chunked_prefill None or True"
                )
            # V10: BooleanOptionalAction negation; without chunking the step budget must hold a whole prompt.
            if (
                cfg.max_num_batched_tokens is not None
                and cfg.max_model_len is not None
                and cfg.max_num_batched_tokens < cfg.max_model_len
            ):
                raise ValueError(
                    f"chunked_prefill=False needs max_num_batched_tokens >= max_model_len for vLLM; got "
                    f"max_num_batched_tokens={cfg.max_num_batched_tokens}, max_model_len={cfg.max_model_len}"
                )
            args.add("--no-enable-chunked-prefill")
    if cfg.prefix_caching is True:
        flag = flag_for(eng, "enable_prefix_caching")
        if flag is not None:  # SGLang's radix cache is on by default and has no enabling flag (S)
            args.add(flag)
    elif cfg.prefix_caching is False:
        # V10 / A --no-enable-prefix-caching; S --disable-radix-cache
        args.add(_role(eng, "disable_prefix_caching"))


def _memory_args(cfg: ServingConfig, args: _Args) -> None:
    eng = cfg.engine
    if cfg.memory_fraction is not None:
        # V10 / A --gpu-memory-utilization (of total memory); S --mem-fraction-static
        args.add(_role(eng, "memory_fraction"), _fmt_float(cfg.memory_fraction))
    kv = _KV_DTYPES[eng][_norm(cfg.kv_cache_dtype)]
    if kv is not None:
        args.add(_role(eng, "kv_cache_dtype"), kv)  # V10 / S / A --kv-cache-dtype (value lists: notes 5.1-5.3)
    if cfg.max_model_len is not None:
        # V10 / A --max-model-len; S --context-length
        args.add(_role(eng, "max_model_len"), cfg.max_model_len)


def _spec_args(cfg: ServingConfig, args: _Args) -> None:
    method = _norm(cfg.spec_method)
    if method == "none":
        return
    eng = cfg.engine
    value = _SPEC_SPELLING[eng][method]
    k = cfg.num_speculative_tokens
    if eng == "vllm":
        # V10 --speculative-config JSON {"method", "model", "num_speculative_tokens"} (notes 5.1)
        spec: dict[str, Any] = {"method": value}
        if method in _SPEC_NEEDS_DRAFT:
            spec["model"] = cfg.draft_model
        spec["num_speculative_tokens"] = k
        args.add(_role(eng, "speculative"), json.dumps(spec, separators=(",", ":")))
    elif eng == "sglang":
        # S --speculative-algorithm with --speculative-num-steps k, --speculative-eagle-topk 1 and
        # --speculative-num-draft-tokens k+1 (a chain of k drafts plus the verified token);
        # NGRAM takes only the draft-token count (its tree settings keep SGLang's defaults).
        args.add(_role(eng, "speculative"), value)
        if method == "ngram":
            args.add("--speculative-num-draft-tokens", k)
        else:
            args.add("--speculative-num-steps", k)
            args.add("--speculative-eagle-topk", 1)
            args.add("--speculative-num-draft-tokens", k + 1)
        if method in _SPEC_NEEDS_DRAFT:
            args.add("--speculative-draft-model-path", cfg.draft_model)
    else:
        # A --method mtp | eagle3, --num-speculative-tokens k, --draft-model (required for eagle3)
        args.add(_role(eng, "speculative"), value)
        args.add("--num-speculative-tokens", k)
        if method in _SPEC_NEEDS_DRAFT:
            args.add("--draft-model", cfg.draft_model)


def _disagg_args(cfg: ServingConfig, args: _Args) -> None:
    role = cfg.disagg_role
    if role is None:
        return
    eng = cfg.engine
    if eng == "vllm":
        # V10 --kv-transfer-config (notes 5.1 example; connector names unverified there)
        args.add(_role(eng, "disaggregation"), json.dumps(_VLLM_KV_TRANSFER, separators=(",", ":")))
    elif eng == "sglang":
        args.add(_role(eng, "disaggregation"), role)  # S --disaggregation-mode prefill | decode
    else:
        # A --kv-transfer-config; role/connector/handshake port from the ATOM P/D recipes (not in the notes)
        kv = {"kv_role": _ATOM_KV_ROLE[role], "kv_connector": "mooncake", "handshake_port": _ATOM_HANDSHAKE_PORT}
        args.add(_role(eng, "disaggregation"), json.dumps(kv, separators=(",", ":")))


def _fmt_float(x: float) -> str:
    return format(float(x), "g")


def engine_args(cfg: ServingConfig) -> list[str]:
    """Full argv of the engine server: launch command, model, then flags (real, catalogued flags only).

    vLLM: ``vllm serve <model> ...`` (model positional); SGLang: ``python3 -m sglang.launch_server
    --model-path <model> --host 0.0.0.0 --port 30000 --enable-metrics ...``; ATOM: ``python3 -m
    atom.entrypoints.openai_server --model <model> --server-port 8000 ...``. Raises ValueError for a
    layout that does not fit one node, a layout the engine cannot express, an unknown or duplicated
    flag (naming it), or a malformed ``extra_args``.
    """
    eng = cfg.engine
    gpu = cfg.gpu_spec
    _check_fits_node(cfg, gpu)
    argv = launch_command(eng)
    mflag = model_flag(eng)
    args = _Args(eng)
    if mflag is None:
        argv.append(cfg.model)  # V10: `vllm serve <model>`
    else:
        args.add(mflag, cfg.model)  # S --model-path, A --model

    # Bind address and HTTP port. SGLang binds 127.0.0.1 by default and must get --host 0.0.0.0 in a
    # Pod (notes 5.2); vLLM (None: all interfaces) and ATOM (0.0.0.0) need no --host. The port is set
    # explicitly so probes, container port and Service agree: vLLM --port 8000, SGLang --port 30000,
    # ATOM --server-port 8000 (--port is ATOM's internal engine port).
    if DEFAULT_HOST[eng] not in (None, "0.0.0.0"):
        args.add(_role(eng, "host"), "0.0.0.0")
    args.add(_role(eng, "port"), default_port(eng))
    metrics = flag_for(eng, "enable_metrics")
    if metrics is not None:
        args.add(metrics)  # S --enable-metrics (off by default; /metrics is always on for vLLM and ATOM)

    _parallel_args(cfg, args)
    _quantization_args(cfg, args)
    _scheduler_args(cfg, args)
    _memory_args(cfg, args)
    _spec_args(cfg, args)
    _disagg_args(cfg, args)
    args.add_extra(cfg.extra_args)
    return argv + args.tokens


def engine_env(cfg: ServingConfig) -> dict[str, str]:
    """Environment of the engine container (plain name -> value pairs)."""
    gpu = cfg.gpu_spec
    env: dict[str, str] = {"HF_HOME": HF_HOME}
    if gpu.vendor == "amd":
        if cfg.engine == "vllm":
            # V10 vllm/envs.py: VLLM_ROCM_USE_AITER is the master switch, default False; InferenceX (I)
            # sets it to 1 on Instinct (notes 5.1). The sub-switches default on.
            env["VLLM_ROCM_USE_AITER"] = "1"
        elif cfg.engine == "sglang":
            # notes 5.2: the aiter attention backend on ROCm is selected with SGLANG_USE_AITER=1, which I
            # exports (whether the ROCm image sets it is unverified).
            env["SGLANG_USE_AITER"] = "1"
        # ATOM is built on AITER; it needs no switch.
    return env


# --------------------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------------------


def gpu_node_label(gpu: GPU) -> tuple[str, str]:
    """(label key, value) that selects nodes with ``gpu`` (notes section 6, K / N)."""
    return _PRODUCT_LABEL_KEY[gpu.vendor], gpu.product_label


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


def _image(cfg: ServingConfig, gpu: GPU) -> str:
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
) -> dict[str, Any]:
    """``apps/v1`` Deployment serving ``cfg`` (one pod per replica, all GPUs of a replica in one pod).

    ``hf_token_secret`` names an optional Secret whose key ``token`` becomes ``HF_TOKEN`` (gated
    models); the pod starts without it. Raises ValueError when a replica needs more GPUs than one
    node holds (multi-node serving needs LeaderWorkerSet / Ray and is not rendered), and when the
    engine would not run the precision asked for with this checkpoint (precision_error).
    """
    check_k8s_names(name, namespace)
    why = precision_error(cfg.engine, cfg.model, cfg.precision)
    if why:
        raise ValueError(why)
    gpu = cfg.gpu_spec
    argv = engine_args(cfg)  # also checks the node fit and every flag
    n_launch = len(launch_command(cfg.engine))
    port = default_port(cfg.engine)
    gpus = cfg.gpus_per_replica
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

    container: dict[str, Any] = {
        "name": cfg.engine,
        "image": _image(cfg, gpu),
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:n_launch],
        "args": argv[n_launch:],
        "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
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
            f"the prefill and decode pools ({_PD_ROUTER[cfg.engine]}), which this manifest does not render")
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }
    return {
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


def render_service(cfg: ServingConfig, name: str, namespace: str = "default") -> dict[str, Any]:
    """ClusterIP Service on the engine's HTTP port (port name ``http``, for a ServiceMonitor on /metrics)."""
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
            "selector": {LABEL_NAME: name},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def render_manifests(cfg: ServingConfig, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    """``[Deployment, Service]`` for ``cfg``."""
    return [render_deployment(cfg, name, namespace), render_service(cfg, name, namespace)]


def to_yaml(manifests: list[dict[str, Any]]) -> str:
    """Multi-document YAML (``---`` separated), keys in rendering order."""
    return yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False, width=4096)
