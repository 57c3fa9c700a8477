"""Tests for inferasim.catalog.engines (defaults read from shared/notes/engine-facts.md)."""

from __future__ import annotations

import dataclasses

import pytest

from inferasim.catalog.engines import (
    ENGINES,
    METRIC_PREFIX,
    EngineDefaults,
    Flag,
    UnknownEngineError,
    default_image,
    default_port,
    engine_defaults,
    engine_flags,
    flag_for,
    is_amd_gpu,
    is_known_flag,
    launch_command,
    model_flag,
    normalize_engine,
    sglang_gpu_memory_settings,
    sglang_max_running_requests,
    sglang_mem_fraction_static,
)

GiB = 1 << 30
MiB = 1 << 20

# Device memory as the drivers report it (SGLang reads MiB from nvidia-smi / rocm-smi).
H100_BYTES = 81559 * MiB  # NVIDIA H100 80GB HBM3
A100_80_BYTES = 81920 * MiB  # NVIDIA A100-SXM4-80GB
L40S_BYTES = 48 * 1000**3  # a "48 GB" card
H200_BYTES = 143771 * MiB  # NVIDIA H200 (~143,800 MB in the notes)
MI300X_BYTES = 192 * GiB  # 196,608 MiB (~196,600 MB in the notes)
MI355X_BYTES = 288 * GiB


# ---------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("vllm", "vllm"),
        ("vLLM", "vllm"),
        ("VLLM", "vllm"),
        ("vllm-openai", "vllm"),
        (" vllm ", "vllm"),
        ("sglang", "sglang"),
        ("SGLang", "sglang"),
        ("atom", "atom"),
        ("ATOM", "atom"),
    ],
)
def test_normalize_engine_accepts_known_spellings(raw: str, expected: str) -> None:
    assert normalize_engine(raw) == expected


@pytest.mark.parametrize("raw", ["trtllm", "", "tgi", "vllm2"])
def test_normalize_engine_rejects_unknown_names_listing_accepted(raw: str) -> None:
    with pytest.raises(UnknownEngineError) as err:
        normalize_engine(raw)
    message = str(err.value)
    for engine in ENGINES:
        assert engine in message
    assert isinstance(err.value, ValueError)


def test_unknown_engine_propagates_from_every_entry_point() -> None:
    for call in (
        lambda: engine_defaults("trtllm", 80 * GiB),
        lambda: engine_flags("trtllm"),
        lambda: is_known_flag("trtllm", "--port"),
        lambda: launch_command("trtllm"),
        lambda: default_port("trtllm"),
        lambda: default_image("trtllm", "nvidia"),
    ):
        with pytest.raises(UnknownEngineError, match="vllm, sglang, atom"):
            call()


def test_engines_tuple() -> None:
    assert ENGINES == ("vllm", "sglang", "atom")


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def test_vllm_h100_gets_large_gpu_defaults() -> None:
    d = engine_defaults("vllm", H100_BYTES, gpu_name="NVIDIA H100 80GB HBM3")
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (1024, 8192)
    assert d.max_prefill_tokens == 8192
    assert d.graph_max_batch == 512  # min(2 * 1024, 512)
    assert d.graph_mode == "cudagraph"


def test_vllm_a100_80gb_gets_small_defaults_despite_memory() -> None:
    d = engine_defaults("vllm", A100_80_BYTES, gpu_name="NVIDIA A100-SXM4-80GB")
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (256, 2048)
    assert d.graph_max_batch == 512  # min(2 * 256, 512)


def test_vllm_48gb_gpu_gets_small_defaults() -> None:
    d = engine_defaults("vllm", L40S_BYTES, gpu_name="NVIDIA L40S")
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (256, 2048)


def test_vllm_threshold_is_70_gib() -> None:
    assert engine_defaults("vllm", 70 * GiB, gpu_name="X").max_num_seqs == 1024
    assert engine_defaults("vllm", 70 * GiB - 1, gpu_name="X").max_num_seqs == 256


def test_vllm_mi300x_and_fixed_defaults() -> None:
    d = engine_defaults("vllm", MI300X_BYTES, tp=8, gpu_name="AMD Instinct MI300X")
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (1024, 8192)
    assert d.block_size == 16
    assert d.memory_fraction == pytest.approx(0.9)
    assert d.memory_rule == "vllm"
    assert d.chunked_prefill and d.prefix_caching and d.mixed_prefill_decode
    assert d.kv_cache_dtype == "auto"
    assert d.schedule_policy == "fcfs"
    assert d.graph_mode == "hipgraph"


# ---------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------


def test_sglang_mem_fraction_mi300x_tp8_matches_notes() -> None:
    d = engine_defaults("sglang", MI300X_BYTES, tp=8, gpu_name="AMD Instinct MI300X")
    # reserved = 512 + 16384*1.5 + 512*2 + 8/8*1024 = 27136 MiB
    assert d.memory_fraction == pytest.approx(0.862, abs=0.002)
    assert d.memory_fraction == pytest.approx(round((196608 - 27136) / 196608, 3))
    assert d.max_num_batched_tokens == 16384
    assert d.graph_max_batch == 512
    assert d.graph_mode == "hipgraph"


def test_sglang_mem_fraction_h200_tp8_matches_notes() -> None:
    d = engine_defaults("sglang", H200_BYTES, tp=8, gpu_name="NVIDIA H200")
    # reserved = 512 + 8192*1.5 + 512*2 + 1024 = 14848 MiB
    assert d.memory_fraction == pytest.approx(0.897, abs=0.002)
    assert d.max_num_batched_tokens == 8192
    assert d.graph_max_batch == 512


def test_sglang_chunked_prefill_by_memory() -> None:
    assert engine_defaults("sglang", MI300X_BYTES).max_num_batched_tokens == 16384
    assert engine_defaults("sglang", MI355X_BYTES).max_num_batched_tokens == 16384
    assert engine_defaults("sglang", 160 * 1024 * MiB).max_num_batched_tokens == 16384
    assert engine_defaults("sglang", H100_BYTES, gpu_name="NVIDIA H100").max_num_batched_tokens == 8192
    assert engine_defaults("sglang", L40S_BYTES).max_num_batched_tokens == 4096


def test_sglang_gpu_memory_table() -> None:
    assert sglang_gpu_memory_settings(16 * 1024, tp=1) == (2048, 8)
    assert sglang_gpu_memory_settings(24 * 1024, tp=1) == (2048, 24)
    assert sglang_gpu_memory_settings(24 * 1024, tp=4) == (2048, 80)
    assert sglang_gpu_memory_settings(46 * 1024, tp=2) == (4096, 32)
    assert sglang_gpu_memory_settings(46 * 1024, tp=8) == (4096, 160)
    assert sglang_gpu_memory_settings(81559, tp=1) == (8192, 256)
    assert sglang_gpu_memory_settings(81559, tp=4) == (8192, 512)
    assert sglang_gpu_memory_settings(143771, tp=2) == (8192, 256)
    assert sglang_gpu_memory_settings(196608, tp=1) == (16384, 512)
    assert sglang_gpu_memory_settings(None) == (4096, 160)


def test_sglang_mem_fraction_rules() -> None:
    # small GPU: no 10 GiB floor
    small = sglang_mem_fraction_static(24 * 1024, 2048, 24, tp=1)
    assert small == pytest.approx(round((24576 - (512 + 3072 + 48 + 128)) / 24576, 3))
    # > 60 GiB: reserved is at least 10240 MiB (H100 TP1: 512+12288+512+128 = 13440 > 10240)
    assert sglang_mem_fraction_static(81559, 8192, 256, tp=1) == pytest.approx(
        round((81559 - 13440) / 81559, 3)
    )
    assert sglang_mem_fraction_static(100 * 1024, 2048, 8, tp=1) == pytest.approx(
        round((102400 - 10240) / 102400, 3)
    )
    # speculative decoding reserves more
    base = sglang_mem_fraction_static(196608, 16384, 512, tp=8)
    eagle = sglang_mem_fraction_static(196608, 16384, 512, tp=8, speculative_algorithm="EAGLE")
    standalone = sglang_mem_fraction_static(196608, 16384, 512, tp=8, speculative_algorithm="STANDALONE")
    ngram = sglang_mem_fraction_static(196608, 16384, 512, tp=8, speculative_algorithm="NGRAM")
    assert standalone < eagle < base == ngram
    # unknown memory
    assert sglang_mem_fraction_static(None, 4096, 160) == pytest.approx(0.88)


def test_sglang_dp_attention_divides_chunk_and_reserves_more() -> None:
    plain = engine_defaults("sglang", MI300X_BYTES, tp=8, gpu_name="MI300X")
    dpa = engine_defaults("sglang", MI300X_BYTES, tp=8, dp_attention=8, gpu_name="MI300X")
    assert dpa.max_num_batched_tokens == 16384 // 8
    # reserved += 512*8*3 + 512*8*1.5 = 18432 -> 45568 MiB
    assert dpa.memory_fraction == pytest.approx(round((196608 - 45568) / 196608, 3))
    assert dpa.memory_fraction < plain.memory_fraction
    # plain DP passed as dp_attention by a caller: never zero tokens per chunk, never an exception
    tiny = engine_defaults("sglang", MI300X_BYTES, tp=1, dp_attention=32768)
    assert tiny.max_num_batched_tokens >= 1


def test_sglang_fixed_defaults() -> None:
    d = engine_defaults("sglang", H200_BYTES, tp=8)
    assert d.max_prefill_tokens == 16384
    assert d.block_size == 1
    assert d.memory_rule == "sglang"
    assert d.chunked_prefill and d.prefix_caching
    assert not d.mixed_prefill_decode
    assert d.kv_cache_dtype == "auto"
    assert d.schedule_policy == "fcfs"
    assert d.max_num_seqs == 2048  # documented stand-in (request-pool floor)


def test_sglang_max_running_requests_clamp() -> None:
    assert sglang_max_running_requests(100_000, 131072) == 2048
    assert sglang_max_running_requests(600_000, 32768) == 4096
    assert sglang_max_running_requests(200_000, 32768) == int(200_000 / 32768 * 512)
    with pytest.raises(ValueError):
        sglang_max_running_requests(1000, 0)


# ---------------------------------------------------------------------------------------------
# ATOM
# ---------------------------------------------------------------------------------------------


def test_atom_defaults() -> None:
    d = engine_defaults("ATOM", MI355X_BYTES, tp=8, gpu_name="AMD Instinct MI355X")
    assert d.engine == "atom"
    assert (d.max_num_seqs, d.max_num_batched_tokens, d.kv_cache_dtype) == (512, 16384, "bf16")
    assert d.max_prefill_tokens == 16384
    assert d.block_size == 16
    assert d.memory_fraction == pytest.approx(0.9)
    assert d.memory_rule == "atom"
    assert d.graph_max_batch == 512
    assert d.graph_mode == "hipgraph"
    assert d.chunked_prefill and d.prefix_caching
    assert not d.mixed_prefill_decode


# ---------------------------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("memory", [L40S_BYTES, H100_BYTES, MI300X_BYTES])
def test_every_default_has_a_source(engine: str, memory: int) -> None:
    d = engine_defaults(engine, memory, tp=8)
    assert isinstance(d, EngineDefaults)
    fields = {f.name for f in dataclasses.fields(d)} - {"engine", "sources"}
    assert set(d.sources) == fields
    tag = {"vllm": "V10", "sglang": "S", "atom": "A"}[engine]
    for name, text in d.sources.items():
        assert text.strip(), name
        assert tag in text, (name, text)


def test_defaults_are_frozen_and_hashable() -> None:
    d = engine_defaults("vllm", H100_BYTES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.max_num_seqs = 1  # type: ignore[misc]
    assert isinstance(hash(d), int)


def test_defaults_reject_bad_sizes() -> None:
    with pytest.raises(ValueError):
        engine_defaults("vllm", H100_BYTES, tp=0)
    with pytest.raises(ValueError):
        engine_defaults("sglang", -1.0)


# ---------------------------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------------------------


def test_known_flags_accepted() -> None:
    assert is_known_flag("vllm", "--max-num-seqs=256")
    assert is_known_flag("vllm", "--max-num-seqs")
    assert is_known_flag("vllm", "-tp")
    assert is_known_flag("vllm", "--no-enable-prefix-caching")
    assert is_known_flag("sglang", "--max-running-requests=128")
    assert is_known_flag("sglang", "--mem-fraction-static")
    assert is_known_flag("sglang", "--enable-metrics")
    assert is_known_flag("sglang", "--disaggregation-mode=prefill")
    assert is_known_flag("atom", "--max-num-seqs")
    assert is_known_flag("atom", "--max_num_seqs")
    assert is_known_flag("atom", "--kv_cache_dtype=fp8")
    assert is_known_flag("atom", "--no-enable_prefix_caching")
    assert is_known_flag("atom", "-tp")


def test_made_up_or_cross_engine_flags_rejected() -> None:
    assert not is_known_flag("vllm", "--max-num-sequences")
    assert not is_known_flag("sglang", "--max-num-sequences")
    assert not is_known_flag("atom", "--max-num-sequences")
    # snake spelling only for ATOM
    assert not is_known_flag("vllm", "--max_num_seqs")
    # engine-specific spellings
    assert not is_known_flag("vllm", "--max-running-requests")
    assert not is_known_flag("sglang", "--max-num-seqs")
    assert not is_known_flag("sglang", "--gpu-memory-utilization")
    assert not is_known_flag("vllm", "--enable-metrics")
    assert not is_known_flag("vllm", "")
    assert not is_known_flag("vllm", "max-num-seqs")
    assert not is_known_flag("vllm", "--")


REQUIRED_FLAGS: dict[str, list[str]] = {
    "vllm": [
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--block-size",
        "--kv-cache-dtype",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--scheduling-policy",
        "--speculative-config",
        "--enforce-eager",
        "--cudagraph-capture-sizes",
        "--quantization",
        "--max-model-len",
        "--host",
        "--port",
        "--served-model-name",
        "--trust-remote-code",
        "--kv-transfer-config",
    ],
    "sglang": [
        "--model-path",
        "--tp-size",
        "--pp-size",
        "--dp-size",
        "--ep-size",
        "--enable-dp-attention",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--max-prefill-tokens",
        "--mem-fraction-static",
        "--page-size",
        "--kv-cache-dtype",
        "--disable-radix-cache",
        "--enable-mixed-chunk",
        "--schedule-policy",
        "--speculative-algorithm",
        "--disable-cuda-graph",
        "--cuda-graph-max-bs",
        "--quantization",
        "--context-length",
        "--host",
        "--port",
        "--enable-metrics",
        "--served-model-name",
        "--trust-remote-code",
        "--disaggregation-mode",
    ],
    "atom": [
        "--model",
        "--server-port",
        "--tensor-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--enable-dp-attention",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--kv-cache-dtype",
        "--block-size",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--cudagraph-capture-sizes",
        "--enforce-eager",
        "--method",
        "--num-speculative-tokens",
        "--kv-transfer-config",
        "--max-model-len",
    ],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_flags_complete_and_consistent(engine: str) -> None:
    flags = engine_flags(engine)
    for name in REQUIRED_FLAGS[engine]:
        assert name in flags, name
    for key, flag in flags.items():
        assert isinstance(flag, Flag)
        assert key == flag.name
        assert flag.name.startswith("-")
        assert flag.help and flag.source
        if engine == "atom" and flag.name.startswith("--"):
            assert "_" not in flag.name  # stored in kebab form
        assert is_known_flag(engine, flag.name)
    # value-taking vs boolean switches
    assert flags["--max-model-len" if engine != "sglang" else "--context-length"].takes_value
    assert not flags["--enforce-eager" if engine != "sglang" else "--disable-cuda-graph"].takes_value


def test_engine_flags_returns_a_copy() -> None:
    flags = engine_flags("vllm")
    flags.pop("--max-num-seqs")
    assert "--max-num-seqs" in engine_flags("vllm")


def test_flag_roles_resolve_to_known_flags() -> None:
    assert flag_for("vllm", "max_num_seqs") == "--max-num-seqs"
    assert flag_for("sglang", "max_num_seqs") == "--max-running-requests"
    assert flag_for("sglang", "memory_fraction") == "--mem-fraction-static"
    assert flag_for("atom", "port") == "--server-port"
    assert flag_for("vllm", "model") is None
    for role in ("max_num_seqs", "memory_fraction", "block_size", "port", "max_model_len"):
        for engine in ENGINES:
            name = flag_for(engine, role)
            assert name is not None and is_known_flag(engine, name)
    with pytest.raises(KeyError):
        flag_for("vllm", "no_such_role")


# ---------------------------------------------------------------------------------------------
# launch, ports, metrics, images
# ---------------------------------------------------------------------------------------------


def test_launch_commands_ports_and_prefixes() -> None:
    assert launch_command("vllm") == ["vllm", "serve"]
    assert launch_command("SGLang") == ["python3", "-m", "sglang.launch_server"]
    assert launch_command("atom") == ["python3", "-m", "atom.entrypoints.openai_server"]
    assert (model_flag("vllm"), model_flag("sglang"), model_flag("atom")) == (None, "--model-path", "--model")
    assert (default_port("vllm"), default_port("sglang"), default_port("atom")) == (8000, 30000, 8000)
    assert METRIC_PREFIX == {"vllm": "vllm:", "sglang": "sglang:", "atom": "atom:"}
    cmd = launch_command("vllm")
    cmd.append("x")
    assert launch_command("vllm") == ["vllm", "serve"]


def test_default_images() -> None:
    assert default_image("vllm", "nvidia").startswith("vllm/vllm-openai:v")
    assert default_image("vllm", "amd").startswith("vllm/vllm-openai-rocm:v")
    assert default_image("sglang", "nvidia").startswith("lmsysorg/sglang:v")
    assert "-mi30x" in default_image("sglang", "AMD", gpu_name="AMD Instinct MI300X")
    assert "-mi35x" in default_image("sglang", "amd", gpu_name="AMD Instinct MI355X")
    assert default_image("atom", "rocm").startswith("rocm/atom")
    with pytest.raises(ValueError, match="ROCm only"):
        default_image("atom", "nvidia")
    with pytest.raises(ValueError, match="vendor"):
        default_image("vllm", "intel")


def test_is_amd_gpu() -> None:
    assert is_amd_gpu("AMD Instinct MI300X")
    assert is_amd_gpu("MI355X")
    assert not is_amd_gpu("NVIDIA H100 80GB HBM3")
    assert not is_amd_gpu("")
