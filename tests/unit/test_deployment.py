"""inferasim.deployment: rendered manifests read back exactly; hand-written ones read by their flags,
image tag and node labels; anything missing that names the kernel set is an error naming the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.deployment import DeploymentError, engine_version_from_image, read_deployment
from inferasim.render import render_deployment, render_manifests, to_yaml

ROUND_TRIP = [
    ServingConfig(engine="vllm", model="meta-llama/Llama-3.1-70B", gpu="H200", layout=Layout(tp=4), replicas=2,
                  precision="fp8", kv_cache_dtype="fp8", max_num_seqs=256, max_num_batched_tokens=8192,
                  prefix_caching=False, memory_fraction=0.92, engine_version="0.10.1", max_model_len=16384),
    ServingConfig(engine="vllm", model="meta-llama/Llama-3.1-8B", gpu="H100", layout=Layout(tp=1)),
    ServingConfig(engine="vllm", model="Qwen/Qwen3-235B-A22B", gpu="MI300X", layout=Layout(tp=4, dp=2, moe_ep=8),
                  chunked_prefill=False, max_num_batched_tokens=40960, max_model_len=32768,
                  extra_args=("--trust-remote-code", "--block-size", "32")),
    ServingConfig(engine="sglang", model="deepseek-ai/DeepSeek-V3", gpu="MI355X", layout=Layout(tp=1, dp=8, moe_ep=8),
                  precision="fp8", kv_cache_dtype="fp8", max_num_seqs=512, max_num_batched_tokens=32768,
                  engine_version="0.5.14", spec_method="mtp", num_speculative_tokens=3),
    ServingConfig(engine="sglang", model="meta-llama/Llama-3.1-70B", gpu="H100", layout=Layout(tp=8),
                  chunked_prefill=False, max_num_batched_tokens=8192, prefix_caching=False, disagg_role="decode"),
    ServingConfig(engine="atom", model="deepseek-ai/DeepSeek-R1", gpu="MI355X", layout=Layout(tp=8, moe_ep=8),
                  kv_cache_dtype="fp8", max_num_seqs=128, engine_version="0.1.4"),
    ServingConfig(engine="atom", model="meta-llama/Llama-3.1-70B", gpu="MI300X", layout=Layout(tp=2),
                  kv_cache_dtype="bf16", memory_fraction=0.85, image="rocm/atom-dev:nightly_202607010000"),
]


@pytest.mark.parametrize("cfg", ROUND_TRIP, ids=lambda c: f"{c.engine}-{c.layout.label()}")
def test_render_then_read_gives_the_same_config(cfg: ServingConfig) -> None:
    live = read_deployment(render_deployment(cfg, "llm", "serving"))
    assert live.config == cfg
    assert (live.name, live.namespace, live.engine) == ("llm", "serving", cfg.engine)
    ks = live.kernel_set()
    assert ks.engine == cfg.engine and ks.engine_version == cfg.engine_version and ks.model == cfg.model


def test_reads_the_deployment_out_of_a_multi_document_file(tmp_path: Path) -> None:
    cfg = ROUND_TRIP[0]
    path = tmp_path / "deploy.yaml"
    path.write_text(to_yaml(render_manifests(cfg, "llm")))  # Deployment + Service
    assert read_deployment(path).config == cfg


def _deployment(command: list[str], args: list[str], image: str, resources: dict[str, str] | None = None,
                node_selector: dict[str, str] | None = None, replicas: int | None = 3) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "server", "image": image, "command": command, "args": args}
    if resources is not None:
        container["resources"] = {"limits": resources}
    spec: dict[str, Any] = {"containers": [{"name": "sidecar", "image": "busybox"}, container]}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    dep: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hand"},
                           "spec": {"template": {"metadata": {"labels": {"app": "hand"}}, "spec": spec}}}
    if replicas is not None:
        dep["spec"]["replicas"] = replicas
    return dep


def test_hand_written_vllm() -> None:
    dep = _deployment(["vllm", "serve"], ["amd/Llama-3.1-70B-Instruct-FP8-KV", "--tensor-parallel-size=8",
                                          "--max-num-seqs", "128", "--kv-cache-dtype", "fp8", "--port", "8080",
                                          "--served-model-name", "llama", "--enforce-eager", "--weird-flag", "x"],
                      "rocm/vllm:rocm6.4.1_vllm_0.9.1_20250715", {"amd.com/gpu": "8"},
                      {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"})
    live = read_deployment(dep)
    c = live.config
    assert (c.engine, c.model, c.gpu, c.layout, c.replicas) == ("vllm", "amd/Llama-3.1-70B-Instruct-FP8-KV",
                                                                 "MI300X", Layout(tp=8), 3)
    assert (c.engine_version, c.max_num_seqs, c.kv_cache_dtype) == ("0.9.1", 128, "fp8")
    assert (live.port, live.served_model_name, live.graph_mode) == (8080, "llama", "eager")
    assert live.unrecognized_args == ("--weird-flag", "x")
    assert "--served-model-name" in c.extra_args and "--port" not in c.extra_args
    assert live.kernel_set().graph_mode == "eager" and live.kernel_set().gpu == "MI300X"


def test_hand_written_sglang_in_a_shell_with_dp_copies_and_device_id() -> None:
    script = ("pip list >/dev/null && python3 -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B "
              "--tp 2 --dp 2 --host 0.0.0.0 --enable-metrics --max-running-requests 64")
    dep = _deployment(["bash", "-c"], [script], "lmsysorg/sglang:v0.5.12-rocm720-mi30x", {"amd.com/gpu": "4"},
                      {"amd.com/gpu.device-id": "74a1"}, replicas=None)
    c = read_deployment(dep).config
    # Without --enable-dp-attention, --dp-size runs DP copies of the tp-2 engine: replicas, not a layout.
    assert (c.engine, c.layout, c.replicas, c.gpu, c.engine_version) == ("sglang", Layout(tp=2), 2, "MI300X",
                                                                         "0.5.12")
    assert c.max_num_seqs == 64


def test_hand_written_atom_snake_flags() -> None:
    dep = _deployment(["python3", "-m", "atom.entrypoints.openai_server"],
                      ["--model", "deepseek-ai/DeepSeek-R1", "-tp", "8", "--enable-expert-parallel",
                       "--kv_cache_dtype", "fp8", "--max_num_seqs", "256"],
                      "rocm/atom:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0_atom0.1.4_202607091539",
                      {"amd.com/gpu": "8"}, {"amd.com/gpu.product-name": "AMD_Instinct_MI355_OAM"})
    c = read_deployment(dep).config
    assert (c.engine, c.layout, c.kv_cache_dtype, c.max_num_seqs, c.engine_version) == (
        "atom", Layout(tp=8, moe_ep=8), "fp8", 256, "0.1.4")


def test_gpu_type_unknown_says_pass_gpu() -> None:
    dep = _deployment(["vllm", "serve"], ["meta-llama/Llama-3.1-8B"], "vllm/vllm-openai:v0.10.1",
                      {"nvidia.com/gpu": "1"})
    with pytest.raises(DeploymentError, match=r"GPU type unknown.*--gpu"):
        read_deployment(dep)
    assert read_deployment(dep, gpu="h100_sxm").config.gpu == "H100"


def test_missing_things_are_named() -> None:
    base = (["vllm", "serve"], ["meta-llama/Llama-3.1-8B"])
    with pytest.raises(DeploymentError, match=r"names no engine version.*--engine-version"):
        read_deployment(_deployment(*base, "vllm/vllm-openai:latest", {"nvidia.com/gpu": "1"},
                                    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    with pytest.raises(DeploymentError, match="requests 2 GPUs but its engine flags use 1"):
        read_deployment(_deployment(*base, "vllm/vllm-openai:v0.10.1", {"nvidia.com/gpu": "2"},
                                    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    with pytest.raises(DeploymentError, match="no container"):
        read_deployment(_deployment(["python3", "app.py"], [], "x:1", {"nvidia.com/gpu": "1"}))
    with pytest.raises(DeploymentError, match="names no model"):
        read_deployment(_deployment(["vllm", "serve"], ["--tensor-parallel-size", "1"], "vllm/vllm-openai:v0.10.1",
                                    {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu.product": "NVIDIA-H200"}))
    with pytest.raises(DeploymentError, match="an nvidia GPU but the container requests amd"):
        read_deployment(_deployment(*base, "vllm/vllm-openai:v0.10.1", {"amd.com/gpu": "1"},
                                    {"nvidia.com/gpu.product": "NVIDIA-H200"}))
    with pytest.raises(DeploymentError, match=r"precision 'compressed-tensors'.*--precision"):
        read_deployment(_deployment(["vllm", "serve"], ["m/x", "--quantization", "compressed-tensors"],
                                    "vllm/vllm-openai:v0.10.1", {"nvidia.com/gpu": "1"},
                                    {"nvidia.com/gpu.product": "NVIDIA-H200"}))


def test_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump({"kind": "Service", "metadata": {"name": "x"}}))
    with pytest.raises(DeploymentError, match=r"no kind: Deployment \(found: Service\)"):
        read_deployment(path)
    with pytest.raises(DeploymentError, match="--deployment: .*absent.yaml does not exist"):
        read_deployment(tmp_path / "absent.yaml")
    with pytest.raises(DeploymentError, match="is a folder"):
        read_deployment(tmp_path)


@pytest.mark.parametrize("image,version", [
    ("vllm/vllm-openai:v0.10.1", "0.10.1"), ("registry:5000/vllm/vllm-openai-rocm:v0.27.1", "0.27.1"),
    ("lmsysorg/sglang:v0.5.12-rocm720-mi30x", "0.5.12"), ("rocm/vllm:rocm6.4.1_vllm_0.9.1_20250715", "0.9.1"),
    ("rocm/vllm-dev:vllm-0.10.1rc1-rocm7.0", "0.10.1rc1"), ("vllm/vllm-openai", None),
    ("vllm/vllm-openai:nightly-abc123", None), ("vllm/vllm-openai@sha256:" + "a" * 64, None),
])
def test_engine_version_from_image(image: str, version: str | None) -> None:
    assert engine_version_from_image(image) == version


def test_the_vllm_openai_image_entrypoint_starts_the_server_from_args_alone() -> None:
    dep = _deployment([], ["--model", "meta-llama/Llama-3.1-8B", "--tensor-parallel-size", "2",
                           "--max-num-seqs", "128"], "vllm/vllm-openai:v0.10.1", {"nvidia.com/gpu": "2"},
                      {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, replicas=2)
    live = read_deployment(dep)
    cfg = live.config
    assert (cfg.engine, cfg.model, cfg.layout.tp, cfg.replicas, cfg.max_num_seqs) == (
        "vllm", "meta-llama/Llama-3.1-8B", 2, 2, 128)
    # Another image with no command starts no known server: still refused, naming the fix.
    other = _deployment([], ["--model", "m"], "busybox:1", {"nvidia.com/gpu": "1"})
    with pytest.raises(DeploymentError, match="check the container's command/args"):
        read_deployment(other)
