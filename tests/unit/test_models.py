"""ModelSpec against published parameter counts and architecture facts."""

from __future__ import annotations

import json

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import (
    ModelConfigError,
    UnknownModelError,
    get_model,
    known_models,
    model_from_config,
    resolve_model_name,
)
from inferasim.core.layout import Layout
from inferasim.model.layoutcost import layout_cost

# (hf id, published total, published active or None). Sources:
# - Llama 3.1 8B / 70B / 405B: Meta model card (huggingface.co/meta-llama/Llama-3.1-*), 8.03B,
#   70.6B, 405.9B parameters.
# - DeepSeek-V3: technical report (arXiv 2412.19437): 671B total, 37B activated per token.
# - Qwen3-235B-A22B: Qwen3 technical report (arXiv 2505.09388) / model card: 235B total, 22B active.
# - gpt-oss-120b: OpenAI gpt-oss model card (2025): 116.8B total, 5.1B active.
# - Mixtral-8x7B: Mistral AI, "Mixtral of experts" (arXiv 2401.04088): 46.7B total, 12.9B active.
PUBLISHED = [
    ("meta-llama/Meta-Llama-3.1-8B", 8.0e9, None),
    ("meta-llama/Meta-Llama-3.1-70B", 70.6e9, None),
    ("meta-llama/Meta-Llama-3.1-405B", 405.9e9, None),
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
    ("Qwen/Qwen3-235B-A22B", 235e9, 22e9),
    ("openai/gpt-oss-120b", 117e9, 5.1e9),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 12.9e9),
]


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED)
def test_published_parameter_counts_within_two_percent(name: str, total: float, active: float | None) -> None:
    m = get_model(name)
    assert abs(m.total_params - total) / total < 0.02, m.total_params
    if active is not None:
        assert abs(m.active_param_count - active) / active < 0.02, m.active_param_count


def test_dense_model_active_is_total_minus_embedding_lookup() -> None:
    m = get_model("meta-llama/Meta-Llama-3.1-8B")
    p = m.params()
    assert m.active_param_count == pytest.approx(p.total - p.embeddings)
    assert not m.is_moe


def test_gqa_kv_bytes_per_token_llama70b() -> None:
    # 80 layers x 8 KV heads x 128 dims x (K and V) x 2 bytes = 327,680 bytes.
    assert get_model("meta-llama/Meta-Llama-3.1-70B").kv_bytes_per_token(2.0) == 80 * 8 * 128 * 2 * 2


def test_mla_kv_is_the_latent() -> None:
    # DeepSeek-V3: (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes.
    m = get_model("deepseek-ai/DeepSeek-V3")
    assert m.uses_mla
    assert m.kv_bytes_per_token(2.0) == (512 + 64) * 61 * 2
    assert m.n_experts == 256 and m.top_k == 8
    assert m.moe_layers == 61 - 3  # first_k_dense_replace = 3


def test_sliding_window_layers_stop_growing() -> None:
    m = get_model("openai/gpt-oss-120b")
    windows = [layer.attention.window for layer in m.layers]
    assert windows.count(128) == 18 and windows.count(None) == 18
    # At long context the sliding layers add almost nothing: half the full-attention rate.
    full = m.kv_bytes_per_token(2.0)
    long = m.kv_bytes_per_token(2.0, context=100_000)
    assert long < 0.51 * full
    read = layout_cost(m, get_gpu("H100"), Layout()).kv_read_bytes
    assert read(1000.0) < read(2000.0) < 2 * read(1000.0)


def test_hybrid_linear_attention_has_state_and_less_kv() -> None:
    m = get_model("Qwen/Qwen3.5-397B-A17B")
    kinds = [layer.attention.kind for layer in m.layers]
    assert kinds.count("linear") == 45 and kinds.count("gqa") == 15
    assert m.state_bytes_per_seq() > 0
    assert m.kv_bytes_per_token(2.0) == 15 * 2 * 256 * 2 * 2


def test_quantized_formats_shrink_weights_in_the_right_places() -> None:
    m = get_model("moonshotai/Kimi-K2.5")
    assert m.checkpoint_format == "int4"
    bf16 = m.weight_bytes("bf16")
    int4 = m.weight_bytes("int4")
    assert int4["routed_experts"] < 0.3 * bf16["routed_experts"]
    assert int4["attention"] == bf16["attention"]  # int4 MoE checkpoints keep attention in 16 bits
    dense = get_model("meta-llama/Meta-Llama-3.1-70B")
    assert dense.weight_bytes("fp4")["attention"] < 0.3 * dense.weight_bytes("bf16")["attention"]
    assert dense.weight_bytes("fp8")["total"] < 0.55 * dense.weight_bytes("bf16")["total"]


def test_flops_grow_with_context_and_prefill_is_quadratic() -> None:
    m = get_model("meta-llama/Meta-Llama-3.1-8B")
    assert m.decode_flops_per_token(8192) > m.decode_flops_per_token(1024)
    lin = m.linear_flops_per_token()
    assert lin == pytest.approx(2 * m.active_param_count, rel=1e-4)  # norms are not matmuls
    attn_1k = m.prefill_flops(1024) - 1024 * lin
    attn_2k = m.prefill_flops(2048) - 2048 * lin
    assert attn_2k / attn_1k == pytest.approx(4.0, rel=1e-6)


def test_every_shared_config_loads_or_is_refused_with_the_field(shared_data) -> None:
    files = sorted((shared_data / "model-configs").glob("*.json"))
    assert len(files) >= 80
    loaded = refused = 0
    for path in files:
        try:
            m = model_from_config(path)
        except ModelConfigError as exc:
            refused += 1
            assert "'" in str(exc), f"{path.name}: refusal must name the field: {exc}"
            continue
        loaded += 1
        assert m.total_params > 1e8 and 0 < m.active_param_count <= m.total_params
    assert loaded >= 70 and refused <= 12


def test_refusal_names_unsupported_field() -> None:
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4,
           "intermediate_size": 128, "compress_ratios": [4, 4]}
    with pytest.raises(ModelConfigError, match="compress_ratios"):
        model_from_config(cfg)
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        model_from_config({"hidden_size": 64, "vocab_size": 10})


def test_names_aliases_and_paths(tmp_path) -> None:
    assert resolve_model_name("meta-llama/Llama-3.1-70B") == "meta-llama/Meta-Llama-3.1-70B"
    assert resolve_model_name("meta-llama--Meta-Llama-3.1-70B") == "meta-llama/Meta-Llama-3.1-70B"
    assert resolve_model_name("zhipuai/GLM-5") == "zai-org/GLM-5"
    assert resolve_model_name("meta-llama/Llama-3.1-70B-Instruct") == "meta-llama/Meta-Llama-3.1-70B"
    with pytest.raises(UnknownModelError, match="config.json"):
        resolve_model_name("acme/NotAModel-3B")
    # The quantizers' checkpoints that public benchmarks serve name the same architecture.
    for spelling, arch in [("amd/Llama-3.1-70B-Instruct-FP8-KV", "meta-llama/Meta-Llama-3.1-70B"),
                           ("amd/Llama-3.3-70B-Instruct-FP8-KV", "meta-llama/Meta-Llama-3.1-70B"),
                           ("amd/DeepSeek-R1-0528-MXFP4-Preview", "deepseek-ai/DeepSeek-R1"),
                           ("nvidia/DeepSeek-R1-FP4", "deepseek-ai/DeepSeek-R1"),
                           ("moonshotai/Kimi-K2-Instruct-0905", "moonshotai/Kimi-K2-Instruct"),
                           ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-ai/DeepSeek-V3.2"),
                           ("amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV", "mistralai/Mixtral-8x7B-v0.1"),
                           ("MiniMaxAI/MiniMax-M2.1", "MiniMaxAI/MiniMax-M2.5"),
                           ("llama3.3-70b", "meta-llama/Meta-Llama-3.1-70B"),  # separators written otherwise
                           ("gpt_oss_120b", "openai/gpt-oss-120b"),
                           ("Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen2-72B")]:
        assert resolve_model_name(spelling) == arch, spelling
    # A local checkpoint folder or a trailing slash names the model by its last component.
    assert resolve_model_name("/models/Llama-3.3-70B-Instruct") == "meta-llama/Meta-Llama-3.1-70B"
    assert resolve_model_name("meta-llama/Llama-3.1-70B-Instruct/") == "meta-llama/Meta-Llama-3.1-70B"
    assert resolve_model_name("/models/Kimi-K2-Thinking") == resolve_model_name("moonshotai/Kimi-K2-Thinking")
    # A name the authors and a quantizer share is the authors' model: DeepSeek-V3.1 is not NVIDIA's
    # NVFP4 checkpoint of it (half the weight bytes).
    assert resolve_model_name("/models/DeepSeek-V3.1/") == resolve_model_name("deepseek-ai/DeepSeek-V3.1")
    # A release date goes, and what is left must still name a catalogued model (no size is guessed).
    with pytest.raises(UnknownModelError):
        resolve_model_name("acme/Llama-3.1-0528")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 131072}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    reference = get_model("meta-llama/Meta-Llama-3.1-8B").total_params
    assert get_model(path).total_params == pytest.approx(reference)
    assert get_model(tmp_path).num_layers == 32


def test_catalog_ships_the_argonne_models() -> None:
    names = set(known_models())
    for n in ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf", "meta-llama/Meta-Llama-3-8B",
              "mistralai/Mistral-7B-v0.1", "Qwen/Qwen2-72B"):
        assert n in names
    # Llama-2-7B: 6.74B parameters (Meta, Llama 2 paper, arXiv 2307.09288, "7B").
    assert get_model("meta-llama/Llama-2-7b-hf").total_params == pytest.approx(6.74e9, rel=0.01)


_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10, "num_attention_heads": 4,
         "intermediate_size": 128, "max_position_embeddings": 2048}


@pytest.mark.parametrize(("change", "field"), [
    ({"hidden_size": "abc"}, "hidden_size"),
    ({"num_attention_heads": 0}, "num_attention_heads"),  # was a ZeroDivisionError
    ({"num_key_value_heads": -1}, "num_key_value_heads"),
    ({"intermediate_size": 1.5}, "intermediate_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"quantization_config": "fp8"}, "quantization_config"),  # was an AttributeError
    ({"architectures": 7}, "architectures"),
    ({"mlp_only_layers": 3}, "mlp_only_layers"),
    ({"layer_types": ["full_attention"]}, "layer_types"),  # one entry for two layers: IndexError before
    ({"moe_layer_freq": "x"}, "moe_layer_freq"),
])
def test_malformed_field_is_refused_by_name(change: dict, field: str) -> None:
    with pytest.raises(ModelConfigError, match=field):
        model_from_config({**_TINY, **change})


def test_malformed_field_in_text_config_is_refused_by_name() -> None:
    with pytest.raises(ModelConfigError, match="linear_num_key_heads"):
        model_from_config({"architectures": ["X"], "text_config": {**_TINY, "linear_num_key_heads": [],
                                                                  "layer_types": ["linear_attention"] * 2}})


@pytest.mark.parametrize(("config", "name", "scales"), [
    # An FP8 checkpoint that names its 128 x 128 weight blocks.
    ({**_TINY, "model_type": "llama", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
     None, "block"),
    # ModelOpt FP8 (per tensor), in config.json or only in the repository name.
    ({**_TINY, "model_type": "qwen3", "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}},
     None, "tensor"),
    ({**_TINY, "model_type": "llama"}, "nvidia/Llama-3.1-8B-Instruct-FP8", "tensor"),
    # compressed-tensors FP8, by its weights' strategy.
    ({**_TINY, "model_type": "llama", "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}}}, None, "block"),
    ({**_TINY, "model_type": "qwen3", "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}}, None, "tensor"),
    # A BF16 config: the family's published FP8 checkpoint decides.
    ({**_TINY, "model_type": "qwen3"}, None, "block"),
    ({**_TINY, "model_type": "glm_moe_dsa"}, None, "block"),
    ({**_TINY, "model_type": "llama"}, None, "tensor"),
])
def test_fp8_scales_from_the_checkpoint_or_the_family(config: dict, name: str | None, scales: str) -> None:
    assert model_from_config(config, name=name).fp8_scales == scales


def test_shipped_models_fp8_scales() -> None:
    assert get_model("deepseek-ai/DeepSeek-R1").fp8_scales == "block"  # its own config names the blocks
    assert get_model("Qwen/Qwen3.5-397B-A17B").fp8_scales == "block"  # BF16 config, block-FP8 family
    assert get_model("meta-llama/Meta-Llama-3.1-70B").fp8_scales == "tensor"
    assert get_model("meta-llama/Meta-Llama-3.1-70B").summary()["fp8_scales"] == "tensor"


def test_attention_kinds_name_multi_head_attention() -> None:
    assert get_model("meta-llama/Llama-2-7b-hf").attention_kinds() == ["mha"]  # 32 KV heads for 32 heads
    assert get_model("meta-llama/Meta-Llama-3.1-8B").attention_kinds() == ["gqa"]  # 8 for 32
    assert get_model("deepseek-ai/DeepSeek-R1").attention_kinds() == ["mla"]


def test_a_config_without_a_context_length_is_refused_by_name() -> None:
    """Without max_position_embeddings every length check would pass silently (context 0)."""
    cfg = {k: v for k, v in _TINY.items() if k != "max_position_embeddings"}
    with pytest.raises(ModelConfigError, match="no max_position_embeddings .*add max_position_embeddings"):
        model_from_config(cfg)
    assert model_from_config({**cfg, "n_positions": 1024}).max_context == 1024  # GPT-2's name for it


@pytest.mark.parametrize(("spelling", "canonical"), [
    ("float8_e4m3fnuz", "fp8"), ("FP8_E4M3FN", "fp8"), ("ptpc_fp8", "fp8"), ("w8a8_fp8", "fp8"),
    ("fp8_dynamic", "fp8"), ("w8a8_int8", "int8"), ("none", "auto"), ("NVFP4", "fp4"), ("mxfp4", "mxfp4"),
    ("fp8-ptpc", "fp8"), ("FP8-Block", "fp8"),
])
def test_precision_spellings_of_engines_and_data_sets(spelling: str, canonical: str) -> None:
    from inferasim.catalog.precision import normalize_precision

    assert normalize_precision(spelling) == canonical
    with pytest.raises(ValueError, match="accepted"):
        normalize_precision("fp7")
