"""Serving-engine catalogue: vLLM, SGLang and ATOM.

Defaults, server flags, launch commands, ports, metric prefixes and images of the three engines
inferasim models. Every value carries the tag of the source it was read from; the tags are those of
section 0 of ``shared/notes/engine-facts.md``:

* ``V10``  ROCm/vllm @ f8c9a385 (v0.10.1 line): ``vllm/engine/arg_utils.py``, ``vllm/config.py``,
  ``vllm/v1/worker/gpu_worker.py``, ``vllm/v1/core/kv_cache_utils.py``, ``vllm/platforms/*``.
* ``S``    sgl-project/sglang @ 001067ff ``python/sglang/srt/server_args.py`` (v0.5.x
  ``_handle_gpu_memory_settings``, ``_handle_data_parallelism``) and ``model_runner`` (stored copies).
* ``A``    ROCm/ATOM @ ffdf3bb5: ``atom/model_engine/{arg_utils.py,model_runner.py}``,
  ``atom/utils/arg_parser.py``, ``atom/entrypoints/openai/api_server.py``, ``README.md``.
* ``I``    SemiAnalysisAI/InferenceX ``configs/`` (image tags and flags used in practice).

Where a fact was read from source outside the notes it says so ("not in the notes").
Unit conventions: GPU memory is passed in **bytes**; SGLang's own rule works in MiB
(``get_device_memory_capacity`` returns total bytes / 2**20, which the notes call "MB").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from inferasim.errors import UserError

__all__ = [
    "ENGINES",
    "METRIC_PREFIX",
    "LATENCY_BUCKETS",
    "SGLANG_ITL_BUCKETS",
    "SGLANG_MAX_PREFILL_TOKENS",
    "SGLANG_TTFT_BUCKETS",
    "VLLM_ITL_BUCKETS",
    "VLLM_TTFT_BUCKETS",
    "DEFAULT_HOST",
    "VLLM_MLA_BLOCK_SIZES",
    "EngineDefaults",
    "Flag",
    "UnknownEngineError",
    "default_image",
    "default_port",
    "engine_defaults",
    "engine_flags",
    "flag_for",
    "engine_gpu_error",
    "is_amd_gpu",
    "is_known_flag",
    "launch_command",
    "model_flag",
    "normalize_engine",
    "prefill_attention_dtype",
    "sglang_gpu_memory_settings",
    "sglang_max_running_requests",
    "sglang_mem_fraction_static",
]

ENGINES: tuple[str, ...] = ("vllm", "sglang", "atom")

GiB: int = 1 << 30
MiB: int = 1 << 20

# --------------------------------------------------------------------------------------------------
# Engine names
# --------------------------------------------------------------------------------------------------


class UnknownEngineError(UserError):
    """Raised for an engine name that is not one of :data:`ENGINES`."""

    def __init__(self, name: object) -> None:
        self.name = name
        super().__init__(
            f"unknown serving engine {name!r}; accepted engines: {', '.join(ENGINES)} "
            f"(case-insensitive; aliases: vllm-openai, vllm-openai-rocm, sgl, sglang-rocm, rocm-atom)"
        )


_ENGINE_ALIASES: dict[str, str] = {
    "vllm": "vllm",
    "vllm-openai": "vllm",  # image name vllm/vllm-openai (section 6)
    "vllm-openai-rocm": "vllm",  # image name vllm/vllm-openai-rocm (section 6)
    "vllm-rocm": "vllm",
    "sglang": "sglang",
    "sgl": "sglang",
    "sglang-rocm": "sglang",  # image name lmsysorg/sglang-rocm (section 6)
    "atom": "atom",
    "rocm-atom": "atom",
    "atom-dev": "atom",  # image name rocm/atom-dev (section 6)
}


def normalize_engine(name: str) -> str:
    """Return the canonical engine name ("vllm", "sglang" or "atom") for ``name``.

    Case-insensitive; surrounding blanks and ``_`` vs ``-`` are ignored. Anything else raises
    :class:`UnknownEngineError`, whose message lists the accepted engines.
    """
    if not isinstance(name, str):
        raise UnknownEngineError(name)
    key = name.strip().lower().replace("_", "-")
    try:
        return _ENGINE_ALIASES[key]
    except KeyError:
        raise UnknownEngineError(name) from None


# --------------------------------------------------------------------------------------------------
# GPU helpers
# --------------------------------------------------------------------------------------------------

_AMD_NAME = re.compile(r"(amd|instinct|radeon|\bmi\s?\d{3}|gfx9\d\d)", re.IGNORECASE)


def release_of(version: str) -> tuple[int, ...]:
    """Leading numeric release of an engine `version` ("0.19.0" -> (0, 19, 0), "v0.6.1" -> (0, 6, 1));
    () for a build named otherwise ("nightly-5b8c30d", "main"), which callers read as current."""
    parts = []
    # A leading "v" (v0.6.1, as image tags write it) is not part of the release.
    for piece in version.strip().lower().removeprefix("v").replace("-", ".").split("."):
        if piece.isdigit():
            parts.append(int(piece))
        else:
            break
    return tuple(parts)


# vLLM's V1 engine became the default in v0.8.0 (vLLM v0.8.0 release notes); ROCm builds kept V0
# until v0.9.1 (ROCm/vllm docs/dev-docker/README.md: "0.9.1 ... V1 engine on by default").
VLLM_V1_DEFAULT = {"nvidia": (0, 8), "amd": (0, 9, 1)}


def vllm_v0(version: str, vendor: str) -> bool:
    """Whether vLLM `version` on a `vendor` GPU runs the V0 engine by default (an unnamed or
    unnumbered build reads as current: V1)."""
    release = release_of(version)
    return bool(release) and release < VLLM_V1_DEFAULT.get(vendor, VLLM_V1_DEFAULT["nvidia"])


# Latency per hop (2 log2(ranks) hops per all-reduce, layoutcost.collective_time) of a small all-reduce
# through RCCL, where vLLM reduces through it rather than its own one-shot custom all-reduce kernel.
# Upstream vLLM switched its custom all-reduce off on every AMD GPU ("not supported on AMD GPUs",
# vllm/config.py ParallelConfig._verify_args) until v0.8.3 enabled it for gfx94x (vllm PRs #14125,
# #16010: MI300 class only); MI200 (gfx90a) kept RCCL (and ROCm/vllm PR #247 switched the fork's off
# on MI250: wrong outputs). Chosen on random halves of the kernel sets of shared/data/argonne-offline
# (vLLM 0.6.1 on MI300X and MI250 at tp 1-8) among 10, 15 and 20 us: 30 us at tp2 and 90 us at tp8 per
# all-reduce, the library's launch and protocol latency inside a graph-captured decode step.
RCCL_HOP_LATENCY = 15e-6
_VLLM_ROCM_CUSTOM_ALLREDUCE = (0, 8, 3)
_GFX90A = ("MI250", "MI250X")
# AMD's own vLLM fork (ROCm/vllm, the rocm/vllm-dev and rocm/vllm images) has run its custom
# all-reduce on MI300 since ROCm/vllm PR #27 (2024-05). A build of it is written with this local
# version tag (0.6.6+rocmfork), which the upstream release number alone cannot tell apart.
ROCM_FORK_TAG = "+rocmfork"


def allreduce_hop_latency(engine: str, version: str, gpu_name: str, vendor: str) -> float:
    """Per-hop latency of the engine's tensor-parallel all-reduce where it differs from the link's
    (0.0: the link's own, as a one-shot custom all-reduce kernel or a current library gets)."""
    if engine != "vllm" or vendor != "amd":
        return 0.0
    if gpu_name in _GFX90A or _upstream_vllm_on_amd_before(engine, version, vendor, _VLLM_ROCM_CUSTOM_ALLREDUCE):
        return RCCL_HOP_LATENCY
    return 0.0


def _upstream_vllm_on_amd_before(engine: str, version: str, vendor: str, release: tuple[int, ...]) -> bool:
    """An upstream vLLM build (not AMD's fork, ROCM_FORK_TAG) on an AMD GPU, numbered below
    `release`; an unnumbered build reads as current."""
    if engine != "vllm" or vendor != "amd" or ROCM_FORK_TAG in version.lower():
        return False
    number = release_of(version)
    return bool(number) and number < release


# vLLM decoded on AMD GPUs with its generic paged-attention kernel until v0.6.2 brought the ROCm
# custom kernel upstream (vllm PR #8310, merged 2024-09-13, after v0.6.1; the fork had it from
# ROCm/vllm PR #22, 2024-05). The generic kernel (csrc/attention/attention_kernels.cu) runs one
# thread block per query head and sequence, each reading its KV head's keys and values: a grouped-
# query model's cache is read once per query head, not once per KV head.
_VLLM_ROCM_CUSTOM_PAGED_ATTENTION = (0, 6, 2)


def decode_reads_per_query_head(engine: str, version: str, vendor: str) -> bool:
    """Whether the engine build's decode attention reads the KV cache once per query head."""
    return _upstream_vllm_on_amd_before(engine, version, vendor, _VLLM_ROCM_CUSTOM_PAGED_ATTENTION)


def engine_gpu_error(engine: str, vendor: str, gpu_name: str) -> str | None:
    """Why `engine` does not run on this GPU (None when it does): ATOM is built on ROCm and AITER
    kernels, for AMD Instinct GPUs only."""
    if normalize_engine(engine) == "atom" and vendor != "amd":
        return f"ATOM runs on AMD Instinct GPUs only (ROCm); {gpu_name} is not one"
    return None


def is_amd_gpu(gpu_name: str) -> bool:
    """True when ``gpu_name`` names an AMD GPU ("AMD Instinct MI300X", "MI355X", "gfx942", ...)."""
    return bool(gpu_name) and _AMD_NAME.search(gpu_name) is not None


def _positive_int(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------------

# vLLM block size is 16 on CUDA and ROCm, except for MLA models, where the attention backend forces
# another size (V10 vllm/platforms/{cuda,rocm}.py; notes 5.1 "--block-size").
VLLM_MLA_BLOCK_SIZES: dict[str, int] = {
    "flashmla": 64,  # V10 platforms/cuda.py: FlashMLA forces block_size 64
    "cutlass_mla": 128,  # V10 platforms/cuda.py: CUTLASS-MLA (Blackwell) forces 128
    "rocm_aiter_mla": 1,  # V10 platforms/rocm.py: AITER MLA requires block_size 1
}

# S server_args.py: --max-prefill-tokens default, the prompt tokens one prefill batch may carry
# (notes 5.2); a separate cap from --chunked-prefill-size.
SGLANG_MAX_PREFILL_TOKENS = 16384

# Largest batch of SGLang's request-to-token pool when --max-running-requests is unset (S,
# model_runner.init_memory_pool, not in the notes): min(max(kv_tokens / context_len * 512, 2048), 4096).
_SGLANG_REQ_POOL_MIN = 2048
_SGLANG_REQ_POOL_MAX = 4096


@dataclass(frozen=True)
class EngineDefaults:
    """Effective scheduler/memory defaults of one engine on one GPU type (per engine instance/rank)."""

    engine: str
    max_num_seqs: int
    max_num_batched_tokens: int
    max_prefill_tokens: int
    block_size: int
    memory_fraction: float
    memory_rule: str
    chunked_prefill: bool
    prefix_caching: bool
    mixed_prefill_decode: bool
    graph_mode: str
    graph_max_batch: int
    kv_cache_dtype: str
    schedule_policy: str
    # field name -> where the default comes from (tag + file); excluded from hashing (a dict)
    sources: dict[str, str] = field(default_factory=dict, hash=False)


def sglang_gpu_memory_settings(gpu_mem_mib: float | None, tp: int = 1) -> tuple[int, int]:
    """SGLang ``(chunked_prefill_size, cuda_graph_max_bs)`` for a GPU of ``gpu_mem_mib`` MiB.

    S ``server_args.py::_handle_gpu_memory_settings`` (notes 5.2 table). The thresholds are
    ``n * 1024`` MiB; ``None`` (memory unknown) gives the fallback 4096 / 160. NPU branches omitted.
    """
    tp = _positive_int(tp, "tp")
    if gpu_mem_mib is None or gpu_mem_mib <= 0:
        return 4096, 160
    if gpu_mem_mib < 20 * 1024:  # T4, 4080
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:  # A10, 4090, 5090
        return 2048, (24 if tp < 4 else 80)
    if gpu_mem_mib < 60 * 1024:  # A100 40GB, L40
        return 4096, (32 if tp < 4 else 160)
    if gpu_mem_mib < 90 * 1024:  # H100, A100 80GB
        return 8192, (256 if tp < 4 else 512)
    if gpu_mem_mib < 160 * 1024:  # H20, H200
        return 8192, (256 if tp < 4 else 512)
    return 16384, 512  # B200, MI300X, MI325X, MI355X


def sglang_mem_fraction_static(
    gpu_mem_mib: float | None,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    tp: int = 1,
    pp: int = 1,
    dp_attention: int = 1,
    speculative_algorithm: str | None = None,
    max_prefill_tokens: int = SGLANG_MAX_PREFILL_TOKENS,
) -> float:
    """SGLang's default ``--mem-fraction-static`` (S ``_handle_gpu_memory_settings``; notes 5.4).

    ``reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp * pp / 8 * 1024``
    (MiB), plus ``cuda_graph_max_bs * dp * 3`` (and another ``* 1.5`` when bs > 300) under DP attention;
    at least 10240 on GPUs above 60 GiB; +6144 for STANDALONE and +2048 for other speculative
    algorithms except NGRAM. Result ``round((gpu_mem - reserved) / gpu_mem, 3)``; 0.88 when the memory is
    unknown. ``chunked_prefill_size`` is the value *before* DP attention divides it (SGLang computes the
    fraction first). Not modelled: the newer piecewise-graph terms and the multimodal adjustment.
    """
    tp = _positive_int(tp, "tp")
    pp = _positive_int(pp, "pp")
    dp_attention = _positive_int(dp_attention, "dp_attention")
    if gpu_mem_mib is None or gpu_mem_mib <= 0:
        return 0.88
    reserved = 512.0
    if chunked_prefill_size > 0:
        reserved += max(chunked_prefill_size, 2048) * 1.5
    else:  # chunked prefill disabled (-1): the prefill budget sizes the activations
        reserved += max(max_prefill_tokens, 2048) * 1.5
    reserved += cuda_graph_max_bs * 2
    reserved += tp * pp / 8 * 1024
    if dp_attention > 1:
        reserved += cuda_graph_max_bs * dp_attention * 3
        if cuda_graph_max_bs > 300:
            reserved += cuda_graph_max_bs * dp_attention * 1.5
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative_algorithm is not None:
        algo = speculative_algorithm.upper()
        if algo == "STANDALONE":
            reserved += 6 * 1024
        elif algo != "NGRAM":
            reserved += 2 * 1024
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def sglang_max_running_requests(max_total_num_tokens: int, context_len: int) -> int:
    """SGLang's request-pool size when ``--max-running-requests`` is unset.

    S ``model_runner.init_memory_pool`` (stored copies, not in the notes; the notes call the formula
    version-dependent): ``min(max(int(kv_tokens / context_len * 512), 2048), 4096)``. Concurrency is in
    practice bounded earlier by the KV pool (``sglang:max_total_num_tokens``).
    """
    if context_len <= 0:
        raise ValueError(f"context_len must be positive, got {context_len!r}")
    estimate = int(max(max_total_num_tokens, 0) / context_len * 512)
    return min(max(estimate, _SGLANG_REQ_POOL_MIN), _SGLANG_REQ_POOL_MAX)


def _vllm_defaults(gpu_memory_bytes: float, gpu_name: str) -> EngineDefaults:
    # V10 arg_utils.py (_set_default_args_v1), `vllm serve` = OPENAI_API_SERVER usage context.
    big = gpu_memory_bytes >= 70 * GiB and "a100" not in gpu_name.lower()
    max_num_seqs = 1024 if big else 256
    max_num_batched_tokens = 8192 if big else 2048
    graph_max_batch = min(2 * max_num_seqs, 512)  # V10 config.py: cuda_graph_sizes = [min(2*seqs, 512)]
    rule = ">= 70 GiB and name without 'a100'" if big else "< 70 GiB or an A100"
    sources = {
        "max_num_seqs": f"V10 vllm/engine/arg_utils.py _set_default_args_v1: vllm serve, {rule} -> "
        f"{max_num_seqs} (1024 if >= 70 GiB and not A100, else 256)",
        "max_num_batched_tokens": f"V10 vllm/engine/arg_utils.py _set_default_args_v1: vllm serve, {rule} "
        f"-> {max_num_batched_tokens} (8192 if >= 70 GiB and not A100, else 2048)",
        "max_prefill_tokens": "V10 V1 scheduler: no separate prefill budget; prefill chunks share "
        "max_num_batched_tokens (notes 5.1)",
        "block_size": "V10 vllm/platforms/{cuda,rocm}.py: None -> 16; MLA exceptions FlashMLA 64, "
        "CUTLASS-MLA 128 (Blackwell), ROCm AITER MLA 1 (see VLLM_MLA_BLOCK_SIZES)",
        "memory_fraction": "V10 vllm/config.py CacheConfig.gpu_memory_utilization = 0.9 (of total memory)",
        "memory_rule": "V10 vllm/v1/worker/gpu_worker.py + kv_cache_utils.py: total*util - non_kv "
        "(notes 5.4)",
        "chunked_prefill": "V10 vllm/engine/arg_utils.py: V1 forces enable_chunked_prefill for "
        "generative models",
        "prefix_caching": "V10 vllm/engine/arg_utils.py: enable_prefix_caching None -> True for "
        "generative models",
        "mixed_prefill_decode": "V10 V1 scheduler (vllm/v1/core/sched/scheduler.py, not in the notes' "
        "file list): one token budget per step shared by running decodes and prefill chunks",
        "graph_mode": "V10 vllm/config.py CompilationConfig: CUDA graphs (HIP graphs on ROCm) on "
        "unless --enforce-eager",
        "graph_max_batch": f"V10 vllm/config.py: cuda_graph_sizes = [min(2*max_num_seqs, 512)] = "
        f"{graph_max_batch}; captures [1, 2, 4] + multiples of 8 up to it",
        "kv_cache_dtype": "V10 vllm/config.py CacheConfig.cache_dtype = 'auto' (= model dtype)",
        "schedule_policy": "V10 vllm/config.py SchedulerConfig.policy = 'fcfs' (--scheduling-policy)",
    }
    return EngineDefaults(
        engine="vllm",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_prefill_tokens=max_num_batched_tokens,
        block_size=16,
        memory_fraction=0.9,
        memory_rule="vllm",
        chunked_prefill=True,
        prefix_caching=True,
        mixed_prefill_decode=True,
        graph_mode="hipgraph" if is_amd_gpu(gpu_name) else "cudagraph",
        graph_max_batch=graph_max_batch,
        kv_cache_dtype="auto",
        schedule_policy="fcfs",
        sources=sources,
    )


def _sglang_defaults(
    gpu_memory_bytes: float, tp: int, pp: int, dp_attention: int, gpu_name: str
) -> EngineDefaults:
    gpu_mem_mib: float | None = gpu_memory_bytes / MiB if gpu_memory_bytes > 0 else None
    chunked, graph_bs = sglang_gpu_memory_settings(gpu_mem_mib, tp)
    fraction = sglang_mem_fraction_static(gpu_mem_mib, chunked, graph_bs, tp, pp, dp_attention)
    if dp_attention > 1:
        # S server_args.py::_handle_data_parallelism runs after the memory settings and divides the
        # chunk size by dp_size (per attention-DP rank). SGLang also asserts tp_size % dp_size == 0;
        # that is left to the caller's layout validation (see engine_defaults on what ``tp`` means).
        chunked_rank = max(chunked // dp_attention, 1)
    else:
        chunked_rank = chunked
    mem = "unknown" if gpu_mem_mib is None else f"{gpu_mem_mib:.0f} MiB"
    sources = {
        "max_num_seqs": "stand-in: S model_runner.init_memory_pool request pool "
        "min(max(kv_tokens/context_len*512, 2048), 4096) (not in the notes) has the model-independent "
        "floor 2048; --max-running-requests None -> derived (S server_args.py); the KV pool binds first. "
        "Use sglang_max_running_requests() when the KV pool is known",
        "max_num_batched_tokens": f"S server_args.py::_handle_gpu_memory_settings: chunked_prefill_size "
        f"{chunked} for {mem} (notes 5.2 table)"
        + (
            f", // dp {dp_attention} under DP attention (_handle_data_parallelism)"
            if dp_attention > 1
            else ""
        ),
        "max_prefill_tokens": "S server_args.py: --max-prefill-tokens default 16384",
        "block_size": "S server_args.py::_handle_page_size: --page-size None -> 1 token",
        "memory_fraction": f"S server_args.py::_handle_gpu_memory_settings: mem_fraction_static = "
        f"round((gpu_mem - reserved_MiB)/gpu_mem, 3) for {mem}, tp={tp}, pp={pp}, "
        f"dp_attention={dp_attention} "
        "(notes 5.4)",
        "memory_rule": "S model_runner.profile_max_num_token: "
        "(free_after_weights - total*(1-mem_fraction_static))"
        " / cell_size (notes 5.4)",
        "chunked_prefill": "S server_args.py: chunked_prefill_size > 0 by the memory table (-1 disables)",
        "prefix_caching": "S server_args.py: --disable-radix-cache default False (radix prefix cache on)",
        "mixed_prefill_decode": "S server_args.py: --enable-mixed-chunk default False (prefill and decode "
        "batches alternate)",
        "graph_mode": "S server_args.py: --disable-cuda-graph default False (HIP graphs on ROCm)",
        "graph_max_batch": f"S server_args.py::_handle_gpu_memory_settings: cuda_graph_max_bs {graph_bs} "
        f"for {mem}, tp={tp} (notes 5.2 table)",
        "kv_cache_dtype": "S server_args.py: --kv-cache-dtype default 'auto' (= model dtype)",
        "schedule_policy": "S server_args.py: --schedule-policy default 'fcfs'",
    }
    return EngineDefaults(
        engine="sglang",
        max_num_seqs=_SGLANG_REQ_POOL_MIN,
        max_num_batched_tokens=chunked_rank,
        max_prefill_tokens=SGLANG_MAX_PREFILL_TOKENS,
        block_size=1,
        memory_fraction=fraction,
        memory_rule="sglang",
        chunked_prefill=chunked_rank > 0,
        prefix_caching=True,
        mixed_prefill_decode=False,
        graph_mode="hipgraph" if is_amd_gpu(gpu_name) else "cudagraph",
        graph_max_batch=graph_bs,
        kv_cache_dtype="auto",
        schedule_policy="fcfs",
        sources=sources,
    )


_ATOM_CUDAGRAPH_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 512)


def _atom_defaults() -> EngineDefaults:
    sources = {
        "max_num_seqs": "A atom/model_engine/arg_utils.py: --max-num-seqs default 512",
        "max_num_batched_tokens": "A atom/model_engine/arg_utils.py: --max-num-batched-tokens default 16384",
        "max_prefill_tokens": "A atom/model_engine/scheduler.py: prefill batches are bounded by "
        "max_num_batched_tokens (no separate prefill budget)",
        "block_size": "A atom/model_engine/arg_utils.py: --block-size default 16",
        "memory_fraction": "A atom/model_engine/arg_utils.py: --gpu-memory-utilization default 0.9",
        "memory_rule": "A atom/model_engine/model_runner.py: total*util - (peak_torch + non_torch + "
        "cudagraph + 2% of total) - backend reserve (notes 5.4)",
        "chunked_prefill": "A atom/model_engine/arg_utils.py: --enable_chunked_prefill on",
        "prefix_caching": "A atom/model_engine/arg_utils.py: --enable_prefix_caching on "
        "(--no-enable_prefix_caching turns it off)",
        "mixed_prefill_decode": "A atom/model_engine/scheduler.py schedule(): returns a prefill-only batch "
        "whenever a prefill (chunk) is scheduled, else a decode batch ('TODO for prefill/decode mixed "
        "batch'; stored copy @000acd9d, not in the notes)",
        "graph_mode": "A atom/model_engine/arg_utils.py: --cudagraph-mode FULL, --level 3 (HIP graphs; "
        "ATOM is ROCm only)",
        "graph_max_batch": "A atom/model_engine/arg_utils.py: --cudagraph-capture-sizes "
        "[1,2,4,8,16,32,48,64,128,256,512] -> 512",
        "kv_cache_dtype": "A atom/model_engine/arg_utils.py: --kv_cache_dtype default 'bf16' (bf16 | fp8)",
        "schedule_policy": "A atom/model_engine/scheduler.py: FIFO waiting deque (prefill first); "
        "no policy flag",
    }
    return EngineDefaults(
        engine="atom",
        max_num_seqs=512,
        max_num_batched_tokens=16384,
        max_prefill_tokens=16384,
        block_size=16,
        memory_fraction=0.9,
        memory_rule="atom",
        chunked_prefill=True,
        prefix_caching=True,
        mixed_prefill_decode=False,
        graph_mode="hipgraph",
        graph_max_batch=max(_ATOM_CUDAGRAPH_CAPTURE_SIZES),
        kv_cache_dtype="bf16",
        schedule_policy="fcfs",
        sources=sources,
    )


def engine_defaults(
    engine: str,
    gpu_memory_bytes: float,
    tp: int = 1,
    pp: int = 1,
    dp_attention: int = 1,
    gpu_name: str = "",
) -> EngineDefaults:
    """Effective defaults of ``engine`` on a GPU with ``gpu_memory_bytes`` of device memory.

    ``tp``/``pp`` are the engine's own ``--tensor-parallel-size``/``--pipeline-parallel-size``. For SGLang
    under ``--enable-dp-attention``, ``--tp-size`` spans all attention-DP ranks (attention TP x dp), and
    that is what ``tp`` should be; it enters the ``tp*pp/8*1024`` reserve and the ``tp < 4`` choice of
    ``cuda_graph_max_bs``. ``dp_attention`` is the SGLang ``--dp-size`` under DP attention (1 = off;
    ignored by vLLM and ATOM). ``gpu_name`` is the device name (``"NVIDIA A100-SXM4-80GB"``,
    ``"AMD Instinct MI300X"``); vLLM tests it for "a100", and it selects CUDA vs HIP graphs.
    """
    name = normalize_engine(engine)
    if gpu_memory_bytes is None or gpu_memory_bytes < 0:
        raise ValueError(f"gpu_memory_bytes must be >= 0, got {gpu_memory_bytes!r}")
    tp = _positive_int(tp, "tp")
    pp = _positive_int(pp, "pp")
    dp_attention = _positive_int(dp_attention, "dp_attention")
    gpu_name = gpu_name or ""
    if name == "vllm":
        return _vllm_defaults(float(gpu_memory_bytes), gpu_name)
    if name == "sglang":
        return _sglang_defaults(float(gpu_memory_bytes), tp, pp, dp_attention, gpu_name)
    return _atom_defaults()


_FP8_KV = ("fp8", "fp8_e4m3")


def prefill_attention_dtype(engine: str, vendor: str, fp4_tensor_cores: bool, kv_dtype: str, mla: bool) -> str:
    """Dtype of the tensor-core math in prefill attention: "fp8" or "bf16".

    vLLM on Blackwell (NVIDIA parts with FP4 tensor cores: its default attention backend there is
    FlashInfer) with an FP8 KV cache quantizes the query to FP8 and runs FlashInfer's TRT-LLM
    attention kernels with FP8 q/k/v (vllm-project/vllm PR #23647, merged 2025-08, "Flashinfer +
    kv_cache_dtype=fp8 will always quantize query to fp8"), so prefill attention runs at the FP8
    rate. MLA models prefill on up-projected 16-bit keys and values, not the cache, and keep BF16;
    Hopper's FlashAttention 3, SGLang and ATOM keep BF16 too. On shared/data/aic-silicon (min-gpus)
    vLLM TTFT went from 13.2% to 12.7% median error (overall 13.47 -> 13.29%), the B300 rows from
    13.9% to 12.9%; the same rule for every engine made SGLang TPOT worse (8.1 -> 8.6%), for
    SGLang's non-MLA models SGLang TTFT (14.1 -> 14.6%), and on H100 too H100 TTFT (13.2 -> 13.3%)."""
    try:
        name = normalize_engine(engine) if engine else ""
    except UnknownEngineError:
        name = ""
    blackwell = vendor == "nvidia" and fp4_tensor_cores
    if name == "vllm" and blackwell and (kv_dtype or "").lower() in _FP8_KV and not mla:
        return "fp8"
    return "bf16"


def sparse_mla_kernel(engine: str, vendor: str, fp8_tensor_cores: bool, fp4_tensor_cores: bool,
                      topk: int) -> tuple[int, int]:
    """How an engine prefills a DeepSeek-sparse-attention (DSA) layer: (query heads per GPU the
    sparse MLA kernel computes for, the longest sequence still prefilled densely).

    The sparse prefill runs FlashMLA's sparse kernel in the absorbed form over the `topk` keys the
    indexer picks; that kernel is built for 64 query heads on Hopper and 128 on Blackwell, so a
    tp-split layer's heads are padded up to that many (sglang srt/layers/attention/nsa_backend.py,
    `_forward_flashmla_sparse`: "requires num_heads to be a multiple of 64 (Hopper) or 128
    (Blackwell)"; vLLM's FlashMLASparseImpl sets `padding = 128` on SM100, else 64). GLM-5 at tp 8
    computes 128 heads for its 8: the padding, not the arithmetic, sets the cost. A batch whose
    longest sequence is at most `topk` tokens is prefilled with dense MHA instead, on Hopper and
    Blackwell (SM90/SM100): SGLang since its adaptive short-sequence path (sgl-project/sglang PR
    #11892, `set_nsa_prefill_impl`), vLLM since PR #47327 (merged 2026-07). Older vLLM releases
    ran every prefill sparse; engine versions are not told apart here. Other vendors' kernels
    (TileLang, aiter) are priced as Hopper's: 64 heads, and no dense path."""
    try:
        name = normalize_engine(engine) if engine else ""
    except UnknownEngineError:
        name = ""
    hopper_or_later = vendor == "nvidia" and fp8_tensor_cores
    heads = 128 if vendor == "nvidia" and fp4_tensor_cores else 64
    dense_upto = topk if hopper_or_later and name in ("sglang", "vllm") else 0
    return heads, dense_upto


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """One server command-line flag."""

    name: str
    takes_value: bool
    help: str
    source: str


def _flags(*specs: tuple[str, bool, str, str]) -> dict[str, Flag]:
    return {n: Flag(name=n, takes_value=v, help=h, source=s) for n, v, h, s in specs}


_V = "V10 vllm/engine/arg_utils.py"
_V_NEW = "V10+ (newer vLLM; used in I)"
_V_CLI = "V10 vllm/entrypoints/openai/cli_args.py"

_VLLM_FLAGS: dict[str, Flag] = _flags(
    # parallel sizes
    ("--tensor-parallel-size", True, "tensor-parallel degree (default 1)", _V),
    ("-tp", True, "alias of --tensor-parallel-size", _V),
    ("--pipeline-parallel-size", True, "pipeline-parallel degree (default 1)", _V),
    ("-pp", True, "alias of --pipeline-parallel-size", _V),
    ("--data-parallel-size", True, "data-parallel engine cores (metric label engine)", _V),
    ("-dp", True, "alias of --data-parallel-size", _V),
    ("--data-parallel-size-local", True, "DP ranks on this node", _V),
    ("--api-server-count", True, "API server processes (multiprocess metrics when > 1)", _V),
    ("--enable-expert-parallel", False, "shard MoE experts over TPxDP instead of TP", _V),
    ("--enable-eplb", False, "expert-parallel load balancer", _V),
    # multi-node (one replica over several nodes; docs.vllm.ai deployment/frameworks/lws: the
    # multiprocessing executor, every pod runs `vllm serve`, the non-leader ranks --headless)
    ("--distributed-executor-backend", True, "mp | ray | uni | external_launcher", _V),
    ("--nnodes", True, "nodes one replica spans (multiprocessing executor)", _V_NEW),
    ("--node-rank", True, "this node's rank among --nnodes (0: the API server)", _V_NEW),
    ("--master-addr", True, "rank 0's address for the multi-node rendezvous", _V_NEW),
    ("--master-port", True, "rank 0's rendezvous port", _V_NEW),
    ("--headless", False, "run the engine ranks of this node without an API server", _V_NEW),
    # scheduler budgets
    ("--max-num-seqs", True, "max sequences per step (serve: 1024 on >= 70 GiB non-A100, else 256)", _V),
    ("--max-num-batched-tokens", True, "token budget per step (serve: 8192 / 2048)", _V),
    ("--enable-chunked-prefill", False, "chunked prefill (forced on in V1)", _V),
    (
        "--no-enable-chunked-prefill",
        False,
        "negation of --enable-chunked-prefill (BooleanOptionalAction)",
        _V,
    ),
    ("--scheduling-policy", True, "fcfs (default) | priority", _V),
    ("--async-scheduling", False, "overlap scheduling with execution (off in V10)", _V),
    # memory / KV cache
    ("--gpu-memory-utilization", True, "fraction of total device memory for this instance (0.9)", _V),
    ("--block-size", True, "KV block size in tokens (16; MLA backends force 64/128/1)", _V),
    ("--kv-cache-dtype", True, "auto | fp8 | fp8_e4m3 | fp8_e5m2 | fp8_inc", _V),
    ("--enable-prefix-caching", False, "hashed full-block prefix cache (on by default)", _V),
    ("--no-enable-prefix-caching", False, "turn the prefix cache off", _V),
    ("--num-gpu-blocks-override", True, "replace the profiled KV block count", _V),
    ("--max-model-len", True, "context length (default from the model config)", _V),
    # speculative decoding
    (
        "--speculative-config",
        True,
        'JSON, e.g. {"method":"eagle3","model":"...","num_speculative_tokens":3}',
        _V,
    ),
    # graphs / compilation
    ("--enforce-eager", False, "no CUDA/HIP graphs", _V),
    ("--compilation-config", True, "JSON (cudagraph_mode, cudagraph_capture_sizes, ...)", _V),
    ("-O", True, "alias of --compilation-config", _V),
    (
        "--cuda-graph-sizes",
        True,
        "V10: one value N captures [1,2,4]+range(8,N,8); default min(2*seqs,512)",
        _V,
    ),
    ("--max-cudagraph-capture-size", True, "largest captured batch (newer vLLM)", _V_NEW),
    ("--cudagraph-capture-sizes", True, "explicit capture sizes (newer vLLM)", _V_NEW),
    # model / quantization
    ("--quantization", True, "quantization method (default from the checkpoint)", _V),
    ("-q", True, "alias of --quantization", _V),
    ("--served-model-name", True, "model name in the API and the metric label model_name", _V),
    ("--trust-remote-code", False, "allow custom model code from the hub", _V),
    # disaggregation
    (
        "--kv-transfer-config",
        True,
        'JSON for P/D, e.g. {"kv_connector":"NixlConnector","kv_role":"kv_both"}',
        _V,
    ),
    # server / metrics
    ("--host", True, "bind address (binds all interfaces when unset)", _V_CLI),
    ("--port", True, "HTTP port for /v1, /health and /metrics (8000)", _V_CLI),
    ("--show-hidden-metrics-for-version", True, "re-enable metrics deprecated in that version", _V),
)

_S = "S python/sglang/srt/server_args.py"
_S_I = "S server_args.py (prefix abbreviation of the long flag; seen in I)"

_SGLANG_FLAGS: dict[str, Flag] = _flags(
    ("--model-path", True, "model path or hub id", _S),
    # parallel sizes
    ("--tp-size", True, "tensor-parallel degree (default 1)", _S),
    ("--tensor-parallel-size", True, "alias of --tp-size", _S),
    ("--tp", True, "abbreviation of --tp-size", _S_I),
    ("--pp-size", True, "pipeline-parallel degree (default 1)", _S),
    ("--pipeline-parallel-size", True, "alias of --pp-size", _S),
    ("--dp-size", True, "DP replicas, or attention-DP ranks with --enable-dp-attention", _S),
    ("--data-parallel-size", True, "alias of --dp-size", _S),
    ("--dp", True, "abbreviation of --dp-size", _S_I),
    (
        "--enable-dp-attention",
        False,
        "attention in DP, MoE in TP/EP (divides chunked_prefill_size by dp)",
        _S,
    ),
    ("--enable-dp-lm-head", False, "DP lm_head (needs --enable-dp-attention)", _S),
    ("--ep-size", True, "expert-parallel degree (default 1)", _S),
    ("--expert-parallel-size", True, "alias of --ep-size", _S),
    # multi-node (docs.sglang.io references/multi_node_deployment: --tp spans all nodes' GPUs)
    ("--dist-init-addr", True, "host:port of node rank 0 for the distributed init", _S),
    ("--nnodes", True, "nodes one server spans (1)", _S),
    ("--node-rank", True, "this node's rank among --nnodes (0 serves HTTP)", _S),
    ("--ep", True, "alias of --ep-size", _S),
    ("--moe-a2a-backend", True, "none | deepep | mooncake | mori | ...", _S),
    # scheduler budgets
    ("--max-running-requests", True, "concurrency cap (None -> derived from the KV/request pools)", _S),
    ("--chunked-prefill-size", True, "tokens per prefill chunk (None -> by GPU memory; -1 disables)", _S),
    ("--max-prefill-tokens", True, "token budget of one prefill batch (16384)", _S),
    ("--max-total-tokens", True, "cap the KV pool size in tokens", _S),
    ("--enable-mixed-chunk", False, "mix a prefill chunk with decodes in one batch", _S),
    ("--schedule-policy", True, "fcfs (default) | lpm | random | dfs-weight | ...", _S),
    ("--schedule-conservativeness", True, "admission conservativeness (x0.3 under DP attention)", _S),
    # memory / KV cache
    ("--mem-fraction-static", True, "(weights + KV pool) / GPU memory (None -> computed)", _S),
    ("--page-size", True, "KV page size in tokens (1)", _S),
    ("--kv-cache-dtype", True, "auto | fp8_e5m2 | fp8_e4m3 | bf16 | mxfp8 | nvfp4 | ...", _S),
    ("--disable-radix-cache", False, "turn the radix prefix cache off", _S),
    ("--context-length", True, "context length (SGLang's --max-model-len)", _S),
    # speculative decoding
    ("--speculative-algorithm", True, "EAGLE | EAGLE3 | NEXTN | STANDALONE | NGRAM", _S),
    ("--speculative-num-steps", True, "draft steps", _S),
    ("--speculative-eagle-topk", True, "EAGLE top-k", _S),
    ("--speculative-num-draft-tokens", True, "draft tokens per step", _S),
    ("--speculative-draft-model-path", True, "draft model", _S),
    # graphs
    ("--disable-cuda-graph", False, "no CUDA/HIP graphs", _S),
    ("--cuda-graph-max-bs", True, "largest captured decode batch (None -> by GPU memory)", _S),
    ("--cuda-graph-bs", True, "explicit captured batch sizes", _S),
    ("--attention-backend", True, "attention kernels (aiter on ROCm)", _S),
    # model / quantization
    ("--quantization", True, "quantization method", _S),
    ("--served-model-name", True, "model name in the API and the metric label model_name", _S),
    ("--trust-remote-code", False, "allow custom model code from the hub", _S),
    # disaggregation
    ("--disaggregation-mode", True, "null | prefill | decode", _S),
    # server_args.py (not in the notes; read in sgl-project/sglang docs/advanced_features/pd_disaggregation.md):
    # the KV transfer engine, the prefill side's bootstrap port the router hands to decode (8998), the RDMA NICs
    ("--disaggregation-transfer-backend", True, "mooncake | nixl | ... (mooncake)", _S),
    ("--disaggregation-bootstrap-port", True, "prefill bootstrap server port (8998)", _S),
    ("--disaggregation-ib-device", True, "RDMA devices for the transfer (None: auto-detected)", _S),
    # server / metrics
    ("--host", True, "bind address (127.0.0.1; set 0.0.0.0 in a Pod)", _S),
    ("--port", True, "HTTP port (30000)", _S),
    ("--enable-metrics", False, "expose /metrics (off by default)", _S),
    ("--collect-tokens-histogram", False, "prompt/generation token histograms", _S),
    ("--enable-metrics-for-all-schedulers", False, "every scheduler rank reports metrics", _S),
    ("--bucket-time-to-first-token", True, "TTFT histogram buckets", _S),
    ("--bucket-inter-token-latency", True, "ITL histogram buckets", _S),
    ("--bucket-e2e-request-latency", True, "e2e histogram buckets", _S),
)

_A = "A atom/model_engine/arg_utils.py"
_A_SRV = "A atom/entrypoints/openai/api_server.py"

# ATOM's FlexibleArgumentParser (A atom/utils/arg_parser.py) accepts kebab and snake spellings of
# every long flag; they are stored in kebab form here.
_ATOM_FLAGS: dict[str, Flag] = _flags(
    ("--model", True, "model path or hub id", _A),
    # server
    ("--server-port", True, "HTTP port for /v1, /health and /metrics (8000)", _A_SRV),
    ("--host", True, "bind address (0.0.0.0)", _A_SRV),
    ("--port", True, "internal engine port (8006), not HTTP", _A),
    # parallel sizes
    ("--tensor-parallel-size", True, "tensor-parallel degree (default 1)", _A),
    ("-tp", True, "alias of --tensor-parallel-size", _A),
    ("-pp", True, "pipeline-parallel degree", _A),
    ("--data-parallel-size", True, "data-parallel degree", _A),
    ("-dp", True, "alias of --data-parallel-size", _A),
    ("-pcp", True, "prefill context-parallel degree", _A),
    ("-dcp", True, "decode context-parallel degree", _A),
    ("--enable-expert-parallel", False, "MoE expert parallel", _A),
    ("--enable-dp-attention", False, "DP attention", _A),
    ("--dp-load-balance", True, "round_robin | least_requests (default) | least_tokens", _A),
    # scheduler budgets
    ("--max-num-seqs", True, "max sequences (512)", _A),
    ("--max-num-batched-tokens", True, "token budget per step (16384)", _A),
    ("--enable-chunked-prefill", False, "chunked prefill (on)", _A),
    ("--long-prefill-token-threshold", True, "cap per-request prefill chunk (0 = off)", _A),
    ("--attn-prefill-chunk-size", True, "attention prefill chunk (16384)", _A),
    # memory / KV cache
    ("--gpu-memory-utilization", True, "fraction of total device memory (0.9)", _A),
    ("--kv-cache-dtype", True, "bf16 (default) | fp8", _A),
    ("--block-size", True, "KV block size (16)", _A),
    ("--enable-prefix-caching", False, "prefix cache (on)", _A),
    ("--no-enable-prefix-caching", False, "turn the prefix cache off", _A),
    ("--max-model-len", True, "context length (default max_position_embeddings)", _A),
    # graphs
    ("--cudagraph-capture-sizes", True, "[1,2,4,8,16,32,48,64,128,256,512]", _A),
    ("--cudagraph-mode", True, "FULL (default) | NONE | PIECEWISE | FULL_AND_PIECEWISE | AF_PIECEWISE", _A),
    ("--level", True, "compilation level (3)", _A),
    ("--enforce-eager", False, "no HIP graphs", _A),
    # speculative decoding
    ("--method", True, "mtp | eagle3 | dspark", _A),
    ("--num-speculative-tokens", True, "draft tokens (1)", _A),
    ("--draft-model", True, "draft model", _A),
    # disaggregation
    ("--kv-transfer-config", True, "P/D disaggregation JSON (default {})", _A),
    ("--disagg-prefill-max-num-seqs", True, "prefill-side sequence cap under P/D", _A),
)

_ENGINE_FLAGS: dict[str, dict[str, Flag]] = {
    "vllm": _VLLM_FLAGS,
    "sglang": _SGLANG_FLAGS,
    "atom": _ATOM_FLAGS,
}

# Semantic role -> flag name per engine (None: the engine has no such flag, or it is unverified).
_FLAG_ROLES: dict[str, dict[str, str | None]] = {
    "model": {"vllm": None, "sglang": "--model-path", "atom": "--model"},  # vLLM: positional
    "tensor_parallel": {
        "vllm": "--tensor-parallel-size",
        "sglang": "--tp-size",
        "atom": "--tensor-parallel-size",
    },
    "pipeline_parallel": {"vllm": "--pipeline-parallel-size", "sglang": "--pp-size", "atom": "-pp"},
    "data_parallel": {"vllm": "--data-parallel-size", "sglang": "--dp-size", "atom": "--data-parallel-size"},
    "expert_parallel": {
        "vllm": "--enable-expert-parallel",
        "sglang": "--ep-size",
        "atom": "--enable-expert-parallel",
    },
    "dp_attention": {"vllm": None, "sglang": "--enable-dp-attention", "atom": "--enable-dp-attention"},
    "max_num_seqs": {"vllm": "--max-num-seqs", "sglang": "--max-running-requests", "atom": "--max-num-seqs"},
    "max_num_batched_tokens": {
        "vllm": "--max-num-batched-tokens",
        "sglang": "--chunked-prefill-size",
        "atom": "--max-num-batched-tokens",
    },
    "max_prefill_tokens": {"vllm": None, "sglang": "--max-prefill-tokens", "atom": None},
    "memory_fraction": {
        "vllm": "--gpu-memory-utilization",
        "sglang": "--mem-fraction-static",
        "atom": "--gpu-memory-utilization",
    },
    "block_size": {"vllm": "--block-size", "sglang": "--page-size", "atom": "--block-size"},
    "kv_cache_dtype": {"vllm": "--kv-cache-dtype", "sglang": "--kv-cache-dtype", "atom": "--kv-cache-dtype"},
    "enable_prefix_caching": {
        "vllm": "--enable-prefix-caching",
        "sglang": None,
        "atom": "--enable-prefix-caching",
    },
    "disable_prefix_caching": {
        "vllm": "--no-enable-prefix-caching",
        "sglang": "--disable-radix-cache",
        "atom": "--no-enable-prefix-caching",
    },
    "enable_chunked_prefill": {
        "vllm": "--enable-chunked-prefill",
        "sglang": None,
        "atom": "--enable-chunked-prefill",
    },
    "mixed_chunk": {"vllm": None, "sglang": "--enable-mixed-chunk", "atom": None},
    "schedule_policy": {"vllm": "--scheduling-policy", "sglang": "--schedule-policy", "atom": None},
    "disable_graphs": {
        "vllm": "--enforce-eager",
        "sglang": "--disable-cuda-graph",
        "atom": "--enforce-eager",
    },
    "graph_max_batch": {"vllm": "--cuda-graph-sizes", "sglang": "--cuda-graph-max-bs", "atom": None},
    "graph_capture_sizes": {
        "vllm": "--cudagraph-capture-sizes",
        "sglang": "--cuda-graph-bs",
        "atom": "--cudagraph-capture-sizes",
    },
    "speculative": {"vllm": "--speculative-config", "sglang": "--speculative-algorithm", "atom": "--method"},
    "quantization": {"vllm": "--quantization", "sglang": "--quantization", "atom": None},
    "max_model_len": {"vllm": "--max-model-len", "sglang": "--context-length", "atom": "--max-model-len"},
    "host": {"vllm": "--host", "sglang": "--host", "atom": "--host"},
    "port": {"vllm": "--port", "sglang": "--port", "atom": "--server-port"},
    "enable_metrics": {"vllm": None, "sglang": "--enable-metrics", "atom": None},  # always on for vLLM/ATOM
    "served_model_name": {"vllm": "--served-model-name", "sglang": "--served-model-name", "atom": None},
    "trust_remote_code": {"vllm": "--trust-remote-code", "sglang": "--trust-remote-code", "atom": None},
    "disaggregation": {
        "vllm": "--kv-transfer-config",
        "sglang": "--disaggregation-mode",
        "atom": "--kv-transfer-config",
    },
    # multi-node replicas (render.render_leader_worker_set); ATOM's multi-node launch is not catalogued
    "nnodes": {"vllm": "--nnodes", "sglang": "--nnodes", "atom": None},
    "node_rank": {"vllm": "--node-rank", "sglang": "--node-rank", "atom": None},
    "rendezvous_addr": {"vllm": "--master-addr", "sglang": "--dist-init-addr", "atom": None},
    "rendezvous_port": {"vllm": "--master-port", "sglang": None, "atom": None},  # SGLang: host:port in one flag
    "executor_backend": {"vllm": "--distributed-executor-backend", "sglang": None, "atom": None},
    "headless": {"vllm": "--headless", "sglang": None, "atom": None},
}


def engine_flags(engine: str) -> dict[str, Flag]:
    """The server flags of ``engine`` that inferasim may render, keyed by flag name (kebab form)."""
    return dict(_ENGINE_FLAGS[normalize_engine(engine)])


def flag_for(engine: str, role: str) -> str | None:
    """Flag name that sets ``role`` (e.g. "max_num_seqs") on ``engine``; None if the engine has none."""
    try:
        per_engine = _FLAG_ROLES[role]
    except KeyError:
        raise KeyError(f"unknown flag role {role!r}; known roles: {', '.join(sorted(_FLAG_ROLES))}") from None
    return per_engine[normalize_engine(engine)]


def is_known_flag(engine: str, flag: str) -> bool:
    """True when ``flag`` (optionally ``--flag=value``) is a catalogued flag of ``engine``.

    ATOM accepts snake and kebab spellings of long flags (``--max_num_seqs`` == ``--max-num-seqs``).
    """
    name = normalize_engine(engine)
    if not isinstance(flag, str):
        return False
    key = flag.strip().split("=", 1)[0]
    if not key.startswith("-") or key.strip("-") == "":
        return False
    if name == "atom" and key.startswith("--"):
        key = "--" + key[2:].replace("_", "-")
    return key in _ENGINE_FLAGS[name]


# --------------------------------------------------------------------------------------------------
# Launch, ports, metrics, images
# --------------------------------------------------------------------------------------------------

_LAUNCH: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "serve"),  # V10: `vllm serve <model>` (model positional)
    "sglang": ("python3", "-m", "sglang.launch_server"),  # S: --model-path
    "atom": ("python3", "-m", "atom.entrypoints.openai_server"),  # A README: --model
}

_MODEL_FLAG: dict[str, str | None] = {"vllm": None, "sglang": "--model-path", "atom": "--model"}

_DEFAULT_PORT: dict[str, int] = {
    "vllm": 8000,  # V10 cli_args.py --port
    "sglang": 30000,  # S server_args.py --port
    "atom": 8000,  # A api_server.py --server-port (--port 8006 is the internal engine port)
}

# Default bind address: vLLM None (all interfaces), SGLang 127.0.0.1 (must be overridden in a Pod),
# ATOM 0.0.0.0 (notes 5.1-5.3).
DEFAULT_HOST: dict[str, str | None] = {"vllm": None, "sglang": "127.0.0.1", "atom": "0.0.0.0"}

METRIC_PREFIX: dict[str, str] = {"vllm": "vllm:", "sglang": "sglang:", "atom": "atom:"}

# Bucket upper bounds of the latency histograms, in seconds (engine-facts.md: notes 1.2 for vLLM,
# `vllm/v1/metrics` buckets, the same in V10 and V12; notes 2 for SGLang, collector.py). ATOM
# exports no latency histograms. They matter beyond the emulator: a p90 read back from Prometheus
# (histogram_quantile) is interpolated within these buckets, so it can only be compared with a
# prediction at their resolution (see inferasim.observe.quantile_bound).
VLLM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
SGLANG_TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
SGLANG_ITL_BUCKETS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
    0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
LATENCY_BUCKETS: dict[str, dict[str, tuple[float, ...]]] = {
    "vllm": {"ttft": VLLM_TTFT_BUCKETS, "itl": VLLM_ITL_BUCKETS},
    "sglang": {"ttft": SGLANG_TTFT_BUCKETS, "itl": SGLANG_ITL_BUCKETS},
}


def launch_command(engine: str) -> list[str]:
    """argv prefix that starts the engine's OpenAI-compatible server (model flag: see model_flag)."""
    return list(_LAUNCH[normalize_engine(engine)])


def model_flag(engine: str) -> str | None:
    """Flag that names the model: None for vLLM (positional after ``vllm serve``)."""
    return _MODEL_FLAG[normalize_engine(engine)]


def default_port(engine: str) -> int:
    """HTTP port serving /v1, /health and /metrics."""
    return _DEFAULT_PORT[normalize_engine(engine)]


# Images (notes section 6; tags seen in I, configs/{amd,nvidia}-master.yaml).
_IMAGES: dict[tuple[str, str], str] = {
    ("vllm", "nvidia"): "vllm/vllm-openai:v0.27.1",
    ("vllm", "amd"): "vllm/vllm-openai-rocm:v0.27.1",
    ("sglang", "nvidia"): "lmsysorg/sglang:v0.5.17",
    ("sglang", "amd"): "lmsysorg/sglang:v0.5.12-rocm720-mi30x",  # gfx942: MI300X / MI325X
    ("atom", "amd"): "rocm/atom:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0_atom0.1.4_202607091539",
}
_SGLANG_AMD_GFX950 = "lmsysorg/sglang:v0.5.14-rocm720-mi35x"  # gfx950: MI350X / MI355X (I)

_VENDORS: dict[str, str] = {
    "amd": "amd",
    "rocm": "amd",
    "instinct": "amd",
    "nvidia": "nvidia",
    "cuda": "nvidia",
}


def default_image(engine: str, vendor: str, gpu_name: str = "") -> str:
    """Container image (without registry host) for ``engine`` on ``vendor`` ("amd"/"nvidia").

    For SGLang on AMD, ``gpu_name`` naming an MI350X/MI355X selects the gfx950 (``-mi35x``) image.
    ATOM is ROCm only: asking for it on NVIDIA raises ValueError.
    """
    name = normalize_engine(engine)
    v = _VENDORS.get(vendor.strip().lower()) if isinstance(vendor, str) else None
    if v is None:
        raise ValueError(f"unknown GPU vendor {vendor!r}; accepted vendors: amd, nvidia")
    if name == "atom" and v == "nvidia":
        raise ValueError("ATOM is ROCm only (AMD Instinct GPUs); there is no NVIDIA image")
    if name == "sglang" and v == "amd" and re.search(r"mi35\d", gpu_name or "", re.IGNORECASE):
        return _SGLANG_AMD_GFX950
    return _IMAGES[(name, v)]
