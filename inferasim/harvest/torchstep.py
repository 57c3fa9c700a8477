"""Time isolated engine iterations of a real dense decoder architecture in PyTorch.

A *pytorch* anchor (DESIGN.md section 3): what one engine step costs on the GPU, without an engine.
The harness builds the model's layers at full size with random weights (nothing is downloaded;
the shapes come from the catalog's config through `inferasim harvest torch-plan`), holds a KV
cache in GPU memory, and times three kinds of step the step-time model distinguishes:

- decode: B sequences, one new token each, attending to C cached tokens (weights + KV read);
- prefill: one prompt of T tokens (dense GEMMs and causal attention FLOPs);
- mixed: B decodes and a T-token prefill chunk in one step (the chunked-prefill step).

Each step runs the layer stack an engine runs: RMSNorm, fused QKV projection, rotary embedding,
KV write, attention (PyTorch's scaled_dot_product_attention, FlashAttention on Hopper), output
projection, fused gate/up projection, SiLU-and-multiply, down projection, final norm and the LM
head on one position per sequence, then a greedy sample. Steps are captured as a CUDA graph where
capture works (as vLLM and SGLang run decode) and timed by CUDA events around each replay,
after warm-up; the median over the repeats is the step time.

This file imports only the standard library and torch, so that it runs as a plain script on a
GPU node whose Python has torch and nothing of inferasim's (`python3 torchstep.py PLAN OUT`).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HARNESS_VERSION = "1"
# Memory kept free beyond weights and KV: activations of the largest step, CUDA graph pools and
# the allocator's slack (measured need is a few GB for an 8192-token prefill of a 32B model).
HEADROOM_BYTES = 10 * 2**30
# Wall-clock budget per timed point: repeats are cut to fit it, never below MIN_REPEATS.
POINT_BUDGET_S = 1.2
MIN_REPEATS = 5


@dataclass(frozen=True)
class Arch:
    """The shapes of a dense decoder-only transformer, as the catalog reads them from config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qk_norm: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Arch:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


def _sync_ms(fn: Any, torch: Any, repeats: int, warmup: int) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn`, timed by CUDA events after `warmup` calls."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


class Model:
    """Random-weight layers of `arch` and a flat per-layer KV cache of `kv_tokens` tokens."""

    def __init__(self, arch: Arch, kv_tokens: int, device: str, dtype: Any, torch: Any) -> None:
        self.a, self.torch, self.device, self.dtype = arch, torch, device, dtype
        a = arch

        def w(*shape: int) -> Any:
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0.0, 0.02)

        qkv = (a.heads + 2 * a.kv_heads) * a.head_dim
        self.layers = [{
            "ln1": torch.ones(a.hidden, device=device, dtype=dtype),
            "wqkv": w(qkv, a.hidden),
            "wo": w(a.hidden, a.heads * a.head_dim),
            "ln2": torch.ones(a.hidden, device=device, dtype=dtype),
            "wgu": w(2 * a.intermediate, a.hidden),
            "wdown": w(a.hidden, a.intermediate),
            "qn": torch.ones(a.head_dim, device=device, dtype=dtype),
            "kn": torch.ones(a.head_dim, device=device, dtype=dtype),
            # One flat buffer per layer for K and for V; each (B, C) decode views its first
            # B*kv_heads*C*head_dim elements as a contiguous [B, kv_heads, C, head_dim] cache.
            "k": w(kv_tokens * a.kv_heads * a.head_dim),
            "v": w(kv_tokens * a.kv_heads * a.head_dim),
        } for _ in range(a.layers)]
        self.embed = w(a.vocab, a.hidden)
        self.ln_f = torch.ones(a.hidden, device=device, dtype=dtype)
        self.lm_head = w(a.vocab, a.hidden)
        self.kv_tokens = kv_tokens
        half = a.head_dim // 2
        inv = 1.0 / (500000.0 ** (torch.arange(half, device=device, dtype=torch.float32) / half))
        pos = torch.arange(65536, device=device, dtype=torch.float32)
        ang = torch.outer(pos, inv)
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)

    def _rms(self, x: Any, g: Any) -> Any:
        t = self.torch
        return t.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-6)

    def _rope(self, x: Any, pos: Any) -> Any:
        # x [n, heads, d]; rotate-half form, as Llama and Qwen apply it.
        c = self.cos[pos].unsqueeze(1)
        s = self.sin[pos].unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)
        return self.torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def step(self, tokens: Any, pos: Any, n_dec: int, ctx: int, n_pref: int) -> Any:
        """One iteration, ending in a greedy sample of each sequence's next token."""
        return self.forward(tokens, pos, n_dec, ctx, n_pref).argmax(dim=-1)

    def forward(self, tokens: Any, pos: Any, n_dec: int, ctx: int, n_pref: int) -> Any:
        """Logits of one iteration: `n_dec` decode tokens first (each at position ctx - 1 of its
        own sequence of `ctx` tokens, whose first ctx - 1 keys and values are in the cache), then
        one prefill chunk of `n_pref` tokens at 0..n_pref-1."""
        t, a = self.torch, self.a
        F = t.nn.functional
        g = a.heads // a.kv_heads
        h = self.embed[tokens]
        for L in self.layers:
            x = self._rms(h, L["ln1"])
            qkv = F.linear(x, L["wqkv"])
            q, k, v = qkv.split([a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim], dim=-1)
            q = q.view(-1, a.heads, a.head_dim)
            k = k.view(-1, a.kv_heads, a.head_dim)
            v = v.view(-1, a.kv_heads, a.head_dim)
            if a.qk_norm:
                q = self._rms(q, L["qn"])
                k = self._rms(k, L["kn"])
            q, k = self._rope(q, pos), self._rope(k, pos)
            outs = []
            if n_dec:
                kc = L["k"][: n_dec * a.kv_heads * ctx * a.head_dim].view(n_dec, a.kv_heads, ctx, a.head_dim)
                vc = L["v"][: n_dec * a.kv_heads * ctx * a.head_dim].view(n_dec, a.kv_heads, ctx, a.head_dim)
                kc[:, :, ctx - 1] = k[:n_dec]
                vc[:, :, ctx - 1] = v[:n_dec]
                # GQA decode: the g query heads of one KV head act as g query rows against it.
                qd = q[:n_dec].view(n_dec, a.kv_heads, g, a.head_dim)
                od = F.scaled_dot_product_attention(qd, kc, vc)
                outs.append(od.reshape(n_dec, a.heads * a.head_dim))
            if n_pref:
                qp = q[n_dec:].transpose(0, 1).unsqueeze(0)
                kp = k[n_dec:].transpose(0, 1).repeat_interleave(g, dim=0).unsqueeze(0)
                vp = v[n_dec:].transpose(0, 1).repeat_interleave(g, dim=0).unsqueeze(0)
                op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
                outs.append(op.squeeze(0).transpose(0, 1).reshape(n_pref, a.heads * a.head_dim))
            o = outs[0] if len(outs) == 1 else t.cat(outs, dim=0)
            h = h + F.linear(o, L["wo"])
            x = self._rms(h, L["ln2"])
            gu = F.linear(x, L["wgu"])
            gate, up = gu.chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, L["wdown"])
        # Logits for the last position of each sequence only (what an engine samples from).
        last = h[:n_dec] if not n_pref else t.cat([h[:n_dec], h[-1:]], dim=0)
        return F.linear(self._rms(last, self.ln_f), self.lm_head)


def time_step(m: Model, n_dec: int, ctx: int, n_pref: int, use_graph: bool) -> dict[str, Any]:
    torch = m.torch
    n = n_dec + n_pref
    tokens = torch.randint(0, m.a.vocab, (n,), device=m.device)
    pos = torch.cat([torch.full((n_dec,), max(ctx - 1, 0), device=m.device, dtype=torch.long),
                     torch.arange(n_pref, device=m.device, dtype=torch.long)])

    def eager() -> Any:
        return m.step(tokens, pos, n_dec, ctx, n_pref)

    fn, graphed, note = eager, False, ""
    with torch.inference_mode():
        t0 = time.perf_counter()
        eager()  # first call: kernel selection and allocation outside the graph and the timing
        if use_graph and torch.cuda.is_available():
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    eager()
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    eager()
                fn, graphed = graph.replay, True
            except Exception as exc:  # capture refused: time eagerly and say why
                note = f"graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); timed eagerly"
                torch.cuda.synchronize()
        first = _sync_ms(fn, torch, 1, 1)[0]
        repeats = max(MIN_REPEATS, min(50, int(POINT_BUDGET_S * 1e3 / max(first, 1e-3))))
        ms = _sync_ms(fn, torch, repeats, 2)
        wall = time.perf_counter() - t0
    del fn
    return {
        "n_decode": n_dec, "decode_context": float(ctx if n_dec else 0), "n_prefill_tokens": n_pref,
        "prefill_context": 0.0, "step_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
        "std_ms": statistics.pstdev(ms), "min_ms": min(ms), "repeats": len(ms), "cuda_graph": graphed,
        "wall_s": wall, "note": note,
    }


def ceilings(torch: Any) -> dict[str, float]:
    """The two ceilings measured on this card now: device-to-device copy bandwidth (bytes read
    plus written) and a bf16 matrix product's rate, each the median of ten after warm-up."""
    if not torch.cuda.is_available():
        return {}
    n = 2 * 2**30
    copy_ms = _median_copy_ms(torch, n)
    k = 8192
    mm_ms = _median_matmul_ms(torch, k)
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": 2 * n / (copy_ms / 1e3), "bf16_matmul_flops": 2 * k**3 / (mm_ms / 1e3)}


def _median_copy_ms(torch: Any, n: int) -> float:
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return statistics.median(_sync_ms(lambda: dst.copy_(src), torch, 10, 3))


def _median_matmul_ms(torch: Any, k: int) -> float:
    x = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(k, k, device="cuda", dtype=torch.bfloat16)
    return statistics.median(_sync_ms(lambda: x @ y, torch, 10, 3))


def device_info(torch: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "host": platform.node(), "harness_version": HARNESS_VERSION}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                    cuda=torch.version.cuda, capability=f"{p.major}.{p.minor}",
                    attention="scaled_dot_product_attention (flash where eligible)")
    else:
        info.update(device="cpu")
    return info


def kv_capacity(arch: Arch, weight_bytes: int, torch: Any, cap_tokens: int) -> int:
    """KV tokens that fit beside the weights and the headroom (all of the plan's cap on a CPU)."""
    if not torch.cuda.is_available():
        return cap_tokens
    free, _total = torch.cuda.mem_get_info()
    room = free - weight_bytes - HEADROOM_BYTES
    return max(0, min(cap_tokens, room // arch.kv_bytes_per_token))


def run_model(entry: dict[str, Any], out_path: Path, result: dict[str, Any], torch: Any, device: str) -> None:
    arch = Arch.from_json(entry["arch"])
    wbytes = int(entry["weight_bytes"])
    want = max([b * c for b, c in entry.get("decode", [])] + [b * c for b, c, _ in entry.get("mixed", [])] + [1])
    kv_tokens = kv_capacity(arch, wbytes, torch, want)
    rec: dict[str, Any] = {"model": entry["model"], "arch": entry["arch"], "weight_bytes": wbytes,
                           "kv_tokens": kv_tokens, "steps": [], "skipped": []}
    result["models"].append(rec)
    t0 = time.perf_counter()
    model = Model(arch, kv_tokens, device, torch.bfloat16 if device != "cpu" else torch.float32, torch)
    rec["build_s"] = time.perf_counter() - t0
    grid = ([(b, c, 0) for b, c in entry.get("decode", [])] + [(0, 0, t) for t in entry.get("prefill", [])] +
            [(b, c, t) for b, c, t in entry.get("mixed", [])])
    for b, c, t in grid:
        if b * c > kv_tokens:
            rec["skipped"].append({"n_decode": b, "decode_context": c, "n_prefill_tokens": t,
                                   "why": f"needs {b * c} KV tokens, {kv_tokens} fit"})
            continue
        try:
            point = time_step(model, b, c, t, use_graph=bool(entry.get("cuda_graph", True)))
        except Exception as exc:  # one failed point (out of memory, say) must not lose the others
            rec["skipped"].append({"n_decode": b, "decode_context": c, "n_prefill_tokens": t,
                                   "why": f"{type(exc).__name__}: {str(exc)[:200]}"})
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        rec["steps"].append(point)
        print(f"{entry['model']:<28} dec {b:>4} x ctx {c:>6}  pref {t:>5}  {point['step_ms']:9.3f} ms"
              f"  (+-{point['std_ms']:.3f}, n={point['repeats']}, graph={point['cuda_graph']})", flush=True)
        out_path.write_text(json.dumps(result, indent=1))
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: torchstep.py PLAN.json OUT.json  (the plan: inferasim harvest torch-plan)", file=sys.stderr)
        return 2
    import torch  # the GPU node's own torch; inferasim itself never needs it

    plan = json.loads(Path(argv[0]).read_text())
    out_path = Path(argv[1])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result: dict[str, Any] = {"schema": "inferasim-torchstep/1", "gpu": plan.get("gpu", ""),
                              "measured_at": started, "device": device_info(torch), "models": []}
    result["ceilings"] = ceilings(torch)
    if result["ceilings"]:
        c = result["ceilings"]
        print(f"ceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
              f"{c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s", flush=True)
    out_path.write_text(json.dumps(result, indent=1))
    torch.manual_seed(0)
    for entry in plan["models"]:
        run_model(entry, out_path, result, torch, device)
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result["gpu_seconds"] = sum(s["wall_s"] for m in result["models"] for s in m["steps"])
    out_path.write_text(json.dumps(result, indent=1))
    return 0 if all(m["steps"] for m in result["models"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
