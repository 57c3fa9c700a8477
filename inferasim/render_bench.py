"""A benchmark Job per configuration: the engine's own benchmark client against the rendered Service, at
the workload's prompt and output lengths and arrival rate, so a user can confirm a prediction without
the operator (issue 27 item 4).

* vLLM (and ATOM, which serves the OpenAI API and ships no client of its own in its image's documented
  use): ``vllm bench serve --backend vllm|openai --dataset-name random`` (vLLM docs, "benchmarking CLI");
  ``--random-range-ratio 0`` keeps every length at its mean.
* SGLang: ``python3 -m sglang.bench_serving --backend sglang --dataset-name random-ids`` (SGLang's
  bench_serving.py): random token ids, not ShareGPT text, which ``random`` would download first;
  ``--random-range-ratio 1`` keeps every length at its mean (its range is [ratio x len, len]).

Both clients need the model's tokenizer: the Job reads it as the engine does (HF_HOME, the optional
token Secret, the model cache PVC with offline loading when the options name one). The Job waits for
the Service to answer before it starts the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferasim.catalog.engines import default_image, default_port
from inferasim.core.config import ServingConfig
from inferasim.core.engine_args import HF_HOME
from inferasim.render import HF_TOKEN_SECRET, LABEL_ENGINE, LABEL_LAYOUT, LABEL_NAME, check_k8s_names, image_of
from inferasim.render_pod import RenderOptions, check_options

__all__ = ["BenchWorkload", "bench_command", "render_bench_job"]

_MAX_REQUESTS = 1_000_000
_DEADLINE_S = 4 * 3600  # a benchmark that has not finished in four hours is stuck, not slow


@dataclass(frozen=True)
class BenchWorkload:
    """What the client sends: fixed prompt and output lengths, Poisson arrivals at ``request_rate``
    requests/s (None: all at once, the clients' default), ``num_requests`` in all."""

    input_tokens: int
    output_tokens: int
    request_rate: float | None
    num_requests: int
    max_concurrency: int | None = None  # a closed-loop workload's clients

    def __post_init__(self) -> None:
        for field, value, most in (("input tokens", self.input_tokens, 10_000_000),
                                   ("output tokens", self.output_tokens, 10_000_000),
                                   ("requests", self.num_requests, _MAX_REQUESTS)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(f"benchmark {field}={value!r} must be a whole number from 1 to {most:,}")
        if self.max_concurrency is not None and (isinstance(self.max_concurrency, bool) or not isinstance(
                self.max_concurrency, int) or not 1 <= self.max_concurrency <= 1_000_000):
            raise ValueError(f"benchmark concurrency {self.max_concurrency!r} must be a whole number from 1 to "
                             "1,000,000")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and
                                                  0 < self.request_rate <= 1_000_000):
            raise ValueError(f"benchmark request rate {self.request_rate!r} must be above 0 and at most 1e6 "
                             "requests/s (leave it unset to send every request at once)")


def bench_command(engine: str, model: str, base_url: str, w: BenchWorkload) -> list[str]:
    """argv of the engine's benchmark client for ``w`` against ``base_url``."""
    rate = ["--request-rate", format(w.request_rate, "g")] if w.request_rate is not None else []
    # --max-concurrency caps requests in flight in both clients (a closed loop's client count).
    rate += ["--max-concurrency", str(w.max_concurrency)] if w.max_concurrency is not None else []
    if engine == "sglang":
        return ["python3", "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", base_url,
                "--model", model, "--dataset-name", "random-ids", "--random-input-len", str(w.input_tokens),
                "--random-output-len", str(w.output_tokens), "--random-range-ratio", "1",
                "--num-prompts", str(w.num_requests), *rate]
    # ATOM's server is OpenAI-compatible: vLLM's client with its generic openai backend.
    backend = "vllm" if engine == "vllm" else "openai"
    return ["vllm", "bench", "serve", "--backend", backend, "--base-url", base_url, "--model", model,
            "--dataset-name", "random", "--random-input-len", str(w.input_tokens),
            "--random-output-len", str(w.output_tokens), "--random-range-ratio", "0", "--ignore-eos",
            "--num-prompts", str(w.num_requests), *rate,
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]


# Waits for the server's /health (all three engines and the P/D routers serve it) with the image's own
# Python, so the Job needs no curl and its clock starts with a serving endpoint.
_WAIT = ('python3 -c "import sys,time,urllib.request\\n'
         'for _ in range(8640):\\n'
         '    try:\\n'
         '        urllib.request.urlopen(sys.argv[1] + \'/health\', timeout=5); sys.exit(0)\\n'
         '    except Exception:\\n'
         '        time.sleep(10)\\n'
         'sys.exit(\'the server never answered /health\')" "$BASE_URL"')


def render_bench_job(cfg: ServingConfig, service: str, name: str, w: BenchWorkload, namespace: str = "default",
                     options: RenderOptions | None = None, *, note: str = "") -> dict[str, Any]:
    """``batch/v1`` Job ``name`` benchmarking Service ``service`` (which serves ``cfg``) with the engine's
    own client. ``note`` (e.g. what was predicted) goes in an annotation beside the result."""
    opts = options or RenderOptions()
    check_options(opts)
    check_k8s_names(name, namespace)
    check_k8s_names(service, namespace)
    port = default_port(cfg.engine)
    base_url = f"http://{service}.{namespace}.svc:{port}"
    if cfg.engine == "atom":
        image = default_image("vllm", cfg.gpu_spec.vendor, cfg.gpu_spec.name)
    else:
        image = image_of(cfg, cfg.gpu_spec)
    argv = bench_command(cfg.engine, cfg.model, base_url, w)
    env: list[dict[str, Any]] = [
        {"name": "BASE_URL", "value": base_url}, {"name": "HF_HOME", "value": HF_HOME},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token",
                                                            "optional": True}}}]
    if opts.offline:
        env += [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "TRANSFORMERS_OFFLINE", "value": "1"}]
    cache: dict[str, Any] = ({"persistentVolumeClaim": {"claimName": opts.model_cache_pvc, "readOnly": opts.offline}}
                             if opts.model_cache_pvc else {"emptyDir": {}})
    labels = {LABEL_NAME: name, "app.kubernetes.io/component": "benchmark",
              "app.kubernetes.io/managed-by": "inferasim", LABEL_ENGINE: cfg.engine, LABEL_LAYOUT: cfg.layout.label()}
    annotations = {"inferasim.io/target": base_url, "inferasim.io/workload": (
        f"prompt {w.input_tokens}, output {w.output_tokens}, "
        f"{format(w.request_rate, 'g') + ' req/s' if w.request_rate is not None else 'all at once'}, "
        f"{'' if w.max_concurrency is None else f'at most {w.max_concurrency} in flight, '}"
        f"{w.num_requests} requests")}
    if note:
        annotations["inferasim.io/predicted"] = note
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "bench", "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", _WAIT + ' && exec "$@"', "bench"], "args": argv, "env": env,
            "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}},
            "volumeMounts": [{"name": "hf-cache", "mountPath": HF_HOME, "readOnly": opts.offline}],
        }],
        "volumes": [{"name": "hf-cache", **cache}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": _DEADLINE_S, "ttlSecondsAfterFinished": 7 * 86400,
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }
