"""The PyTorch step harness computes the transformer it claims to time (runs where torch is installed).

CI's machine has no torch (inferasim never needs it); the GPU node that runs the harness has.
Here the harness runs on the CPU in float64 against a direct, loop-by-head reference of the same
layers: grouped-query decode against the cache, causal prefill, and a mixed step of both.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the harness runs on a GPU node's torch; none is installed here")

from inferasim.harvest import torchstep  # noqa: E402

ARCH = torchstep.Arch(hidden=64, layers=2, heads=8, kv_heads=2, head_dim=16, intermediate=96, vocab=50, qk_norm=True)


def _reference(m: torchstep.Model, tokens, pos, n_dec: int, ctx: int, n_pref: int):
    """The same model written out one sequence and one head at a time."""
    F = torch.nn.functional
    a = m.a
    g = a.heads // a.kv_heads
    h = m.embed[tokens].clone()
    for L in m.layers:
        x = m._rms(h, L["ln1"])
        qkv = x @ L["wqkv"].T
        q, k, v = qkv.split([a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim], dim=-1)
        q = q.view(-1, a.heads, a.head_dim)
        k = k.view(-1, a.kv_heads, a.head_dim)
        v = v.view(-1, a.kv_heads, a.head_dim)
        q, k = m._rms(q, L["qn"]), m._rms(k, L["kn"])
        q, k = m._rope(q, pos), m._rope(k, pos)
        out = torch.zeros(len(tokens), a.heads * a.head_dim, dtype=h.dtype)
        size = n_dec * a.kv_heads * ctx * a.head_dim
        kc = L["k"][:size].view(n_dec, a.kv_heads, ctx, a.head_dim).clone() if n_dec else None
        vc = L["v"][:size].view(n_dec, a.kv_heads, ctx, a.head_dim).clone() if n_dec else None
        for b in range(n_dec):
            kc[b, :, ctx - 1] = k[b]
            vc[b, :, ctx - 1] = v[b]
            for hd in range(a.heads):
                kv = hd // g
                w = F.softmax(kc[b, kv] @ q[b, hd] / math.sqrt(a.head_dim), dim=-1)
                out[b, hd * a.head_dim:(hd + 1) * a.head_dim] = w @ vc[b, kv]
        for t in range(n_pref):
            i = n_dec + t
            for hd in range(a.heads):
                kv = hd // g
                keys, vals = k[n_dec:i + 1, kv], v[n_dec:i + 1, kv]
                w = F.softmax(keys @ q[i, hd] / math.sqrt(a.head_dim), dim=-1)
                out[i, hd * a.head_dim:(hd + 1) * a.head_dim] = w @ vals
        h = h + out @ L["wo"].T
        x = m._rms(h, L["ln2"])
        gate, up = (x @ L["wgu"].T).chunk(2, dim=-1)
        h = h + (F.silu(gate) * up) @ L["wdown"].T
    last = h[:n_dec] if not n_pref else torch.cat([h[:n_dec], h[-1:]])
    return m._rms(last, m.ln_f) @ m.lm_head.T


@pytest.mark.parametrize("n_dec,ctx,n_pref", [(3, 7, 0), (0, 0, 5), (2, 9, 4)])
def test_step_matches_reference(n_dec: int, ctx: int, n_pref: int) -> None:
    torch.manual_seed(n_dec * 100 + ctx * 10 + n_pref)
    m = torchstep.Model(ARCH, kv_tokens=64, device="cpu", dtype=torch.float64, torch=torch)
    n = n_dec + n_pref
    tokens = torch.randint(0, ARCH.vocab, (n,))
    pos = torch.cat([torch.full((n_dec,), max(ctx - 1, 0), dtype=torch.long), torch.arange(n_pref)])
    ref = _reference(m, tokens, pos, n_dec, ctx, n_pref)
    with torch.inference_mode():
        got = m.forward(tokens, pos, n_dec, ctx, n_pref)
    assert got.shape == (n_dec + (1 if n_pref else 0), ARCH.vocab)
    assert torch.linalg.norm(got - ref) / torch.linalg.norm(ref) < 1e-10


def test_harness_script_writes_a_result(tmp_path: Path) -> None:
    plan = {"gpu": "cpu", "models": [{"model": "tiny", "arch": ARCH.__dict__, "weight_bytes": 0,
                                      "decode": [[2, 16], [1, 1000]], "prefill": [8], "mixed": [[2, 8, 4]]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, torchstep.__file__, str(tmp_path / "plan.json"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["schema"] == "inferasim-torchstep/1"
    steps = res["models"][0]["steps"]
    # On a CPU the KV cache is sized to the plan's largest decode (1 x 1000 tokens): all four ran.
    assert [(s["n_decode"], s["n_prefill_tokens"]) for s in steps] == [(2, 0), (1, 0), (0, 8), (2, 4)]
    assert all(s["step_ms"] > 0 and s["repeats"] >= torchstep.MIN_REPEATS for s in steps)
