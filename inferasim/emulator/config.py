"""What an emulator emulates: model, GPU, engine, layout, step-time parameters, limits.

The step-time model, the layout costs and the scheduler limits are exactly those the predictor
uses (`layoutcost.layout_cost`, `model.steady.engine_sched`, the KV dtype rule of
`predictor.benchmark_kv_dtype`), so that an anchor harvested from the emulator and the
emulator's own timing can be compared like for like.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferasim.catalog.engines import normalize_engine
from inferasim.catalog.gpus import GPU, get_gpu, normalize_gpu_name
from inferasim.catalog.models import ModelSpec, get_model, resolve_model_name
from inferasim.core.layout import Layout
from inferasim.model.anchors import load_anchor
from inferasim.model.layoutcost import LayoutCost, layout_cost
from inferasim.model.memory import layout_problems
from inferasim.model.steady import EngineSched, engine_sched
from inferasim.model.steptime import StepParams, default_params

# Without `ignore_eos` a real model stops at an end-of-sequence token of its own choosing; the
# emulator draws that length from a geometric distribution with this mean (seeded).
DEFAULT_NATURAL_OUTPUT_MEAN = 128


@dataclass
class EmulatorConfig:
    """Everything `inferasim emulate` takes. `params` (explicit StepParams) wins over `anchor`
    (fitted parameters of an anchor file), which wins over the GPU-family defaults."""

    model: str
    gpu: str
    engine: str = "vllm"
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (see EmulatorHandle.url)
    speedup: float = 1.0
    precision: str = "auto"
    kv_dtype: str | None = None  # None: the benchmark rule (fp8 KV for fp8/fp4 weights)
    engine_version: str = ""
    anchor: str | Path | None = None
    params: StepParams | None = None
    seed: int = 0
    served_model_name: str | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    max_model_len: int | None = None
    natural_output_mean: int = DEFAULT_NATURAL_OUTPUT_MEAN
    # Real seconds between writes of a stream's intermediate tokens (first and last tokens are
    # always written at once); None = automatic (see Emulator.stream_interval), 0 = every step.
    stream_interval: float | None = None
    # Fault injection, for testing what measures the emulator (the harvest's re-measurement): the
    # first step whose batch holds `stall_at_batch` sequences or more takes `stall_s` emulated
    # seconds longer, once, as a step pays a kernel compiled or autotuned at the first use of a
    # new shape (SGLang's DeepGEMM JIT, FlashInfer's MoE autotuner). None: no stall.
    stall_at_batch: int | None = None
    stall_s: float = 0.0

    def layout(self) -> Layout:
        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, moe_ep=self.ep)


@dataclass
class Resolved:
    config: EmulatorConfig
    engine: str
    model: ModelSpec
    gpu: GPU
    layout: Layout
    precision: str
    kv_dtype: str
    params: StepParams
    params_source: str
    cost: LayoutCost
    sched: EngineSched
    served_name: str
    max_model_len: int


def _kv_dtype_for(precision: str) -> str:
    from inferasim.model.predictor import benchmark_kv_dtype

    return benchmark_kv_dtype(precision)


def resolve(config: EmulatorConfig) -> Resolved:
    """Resolve names through the catalogs; ValueError (with the catalogs' messages) on bad input."""
    if not config.speedup > 0:
        raise ValueError(f"--speedup must be positive, got {config.speedup!r}")
    if config.stream_interval is not None and not config.stream_interval >= 0:
        raise ValueError(f"stream interval must be >= 0 seconds, got {config.stream_interval!r}")
    if config.stall_at_batch is not None and not (config.stall_at_batch >= 1 and config.stall_s > 0):
        raise ValueError(f"a stall needs a batch of at least 1 sequence and a positive duration, got "
                         f"--stall-at-batch {config.stall_at_batch!r} --stall-s {config.stall_s!r}")
    if not 0 <= config.port <= 65535:
        raise ValueError(f"--port must be within 0..65535, got {config.port}")
    engine = normalize_engine(config.engine)
    if engine == "atom":
        # ATOM's /metrics has its own unlabelled names (notes 3); only vLLM and SGLang are emulated.
        raise ValueError("the emulator speaks vllm or sglang; ATOM is not emulated (its metrics differ)")
    model = get_model(config.model)
    gpu = get_gpu(config.gpu)
    layout = config.layout()
    _check_layout(model, layout, engine)
    precision = config.precision or "auto"
    params: StepParams
    if config.params is not None:
        from inferasim.emulator.api import ApiError, merge_params

        try:
            params = merge_params(config.params, config.params.as_dict())  # range checks only
        except ApiError as exc:
            raise ValueError(f"step-time parameters: {exc.message}") from None
        source = "explicit parameters"
    elif config.anchor:
        params, source, anchor_precision = _params_from_anchor(Path(config.anchor), engine, model, gpu)
        if precision == "auto" and anchor_precision:
            precision = anchor_precision
    else:
        params, source = default_params(gpu, engine, config.engine_version), "GPU-family defaults (unanchored)"
    kv_dtype = config.kv_dtype or _kv_dtype_for(precision)
    cost = layout_cost(model, gpu, layout, precision, kv_dtype, engine, config.engine_version)
    sched = engine_sched(engine, model, gpu, layout, precision, config.engine_version, kv_dtype,
                         max_num_seqs=config.max_num_seqs, max_batched_tokens=config.max_batched_tokens)
    if sched.kv_tokens * params.kv_scale < sched.block_size * 2:
        raise ValueError(f"{model.name} does not fit {gpu.name} at {layout.label()} ({engine}, {precision}): "
                         "no room left for the KV cache by the memory model; use more GPUs or a smaller precision")
    if config.max_model_len is not None and model.max_context and config.max_model_len > model.max_context:
        # vLLM refuses a max_model_len beyond the model's max_position_embeddings at start-up.
        raise ValueError(f"--max-model-len {config.max_model_len} exceeds {model.name}'s context of "
                         f"{model.max_context} tokens")
    max_len = config.max_model_len or model.max_context or 32768
    return Resolved(config=config, engine=engine, model=model, gpu=gpu, layout=layout, precision=precision,
                    kv_dtype=kv_dtype, params=params, params_source=source, cost=cost, sched=sched,
                    served_name=config.served_model_name or config.model, max_model_len=int(max_len))


def _check_layout(model: ModelSpec, layout: Layout, engine: str) -> None:
    """Refuse a layout the real engine refuses at start-up (`memory.layout_problems`: tp must
    divide the attention heads and fit the KV heads; no engine starts with more expert shards than
    experts or more stages than layers)."""
    problems = layout_problems(model, layout, engine)
    if problems:
        # The widths this engine would start with, when the width is what it refused.
        fine = [d for d in range(1, 65) if not any("tp=" in p for p in layout_problems(model, Layout(tp=d), engine))]
        hint = f"; choose --tp among {fine}" if any("tp=" in p for p in problems) and fine else ""
        raise ValueError(f"{model.name} cannot be served at {layout.label()} by {engine}: "
                         + "; ".join(problems) + hint)


def _params_from_anchor(path: Path, engine: str, model: ModelSpec, gpu: GPU) -> tuple[StepParams, str, str]:
    from inferasim.model.predictor import fitted_from_anchor

    anchor = load_anchor(path)  # AnchorFileError is a ValueError naming the file and fields
    ks = anchor.kernel_set
    problems = []
    if normalize_engine(ks.engine) != engine:
        problems.append(f"engine {ks.engine!r} (emulating {engine!r})")
    try:
        same_model = resolve_model_name(ks.model) == resolve_model_name(model.name)
    except ValueError:
        same_model = ks.model == model.name
    if not same_model:
        problems.append(f"model {ks.model!r} (emulating {model.name!r})")
    try:
        same_gpu = normalize_gpu_name(ks.gpu) == gpu.name
    except ValueError:
        same_gpu = False
    if not same_gpu:
        problems.append(f"gpu {ks.gpu!r} (emulating {gpu.name!r})")
    if problems:
        raise ValueError(f"anchor {path} measured other kernels: " + ", ".join(problems))
    fitted = fitted_from_anchor(anchor)
    return fitted.params, f"anchor {path.name} ({anchor.id})", ks.precision
