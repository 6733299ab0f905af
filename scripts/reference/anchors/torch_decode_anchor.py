# Decode anchor for `pope-bench sample` (scripts/bench_sample.sh): what a PyTorch user would write for fast small-model generation
# (gpt-fast style): the GPT of torch_gpt_anchor.py (RMSNorm, tanh-GELU MLP, tied head) with a
# static KV cache, one token per step, the step compiled with mode="reduce-overhead" (CUDA graphs).
# RoPE caches rotated keys; PoPE caches its 2d-wide polar keys (softplus magnitude, phase s·ω + δ).
# Usage: python3 torch_decode_anchor.py [124m|774m] [rope|pope] [batch] [prompt_len] [new_tokens]
#        python3 torch_decode_anchor.py check     (CPU: cached decode == full forward, tiny model)
# Prints one JSON line: prefill and decode tokens/s.
import json, math, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F


def sdpa(q, k, v, mask, scale):  # F.scaled_dot_product_attention where PyTorch has it (>= 2.0)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.softmax(((q @ k.transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf")), -1) @ v


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Decoder(nn.Module):
    def __init__(s, L, C, H, pos, Tmax, B, V=50304, dtype=torch.bfloat16, device="cuda"):
        super().__init__()
        s.L, s.C, s.H, s.d, s.pos, s.V = L, C, H, C // H, pos, V
        kw = dict(dtype=dtype, device=device)
        s.wte = nn.Parameter(torch.randn(V, C, **kw) * 0.02)
        s.qkv = nn.ParameterList([nn.Parameter(torch.randn(3 * C, C, **kw) * 0.02) for _ in range(L)])
        s.proj = nn.ParameterList([nn.Parameter(torch.randn(C, C, **kw) * 0.02) for _ in range(L)])
        s.fc = nn.ParameterList([nn.Parameter(torch.randn(4 * C, C, **kw) * 0.02) for _ in range(L)])
        s.fc2 = nn.ParameterList([nn.Parameter(torch.randn(C, 4 * C, **kw) * 0.02) for _ in range(L)])
        s.n1 = nn.ParameterList([nn.Parameter(torch.ones(C, **kw)) for _ in range(L)])
        s.n2 = nn.ParameterList([nn.Parameter(torch.ones(C, **kw)) for _ in range(L)])
        s.nf = nn.Parameter(torch.ones(C, **kw))
        d = s.d
        p = torch.arange(Tmax, device=device, dtype=torch.float64)
        if pos == "rope":
            ang = torch.outer(p, 10000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
        else:
            ang = torch.outer(p, 10000.0 ** (-torch.arange(d, device=device, dtype=torch.float64) / d))
            s.delta = nn.ParameterList([nn.Parameter(-torch.rand(H, d, device=device) * 0.1) for _ in range(L)])
        s.register_buffer("cos", ang.cos().to(dtype)), s.register_buffer("sin", ang.sin().to(dtype))
        kd = 2 * d if pos == "pope" else d
        s.register_buffer("kc", torch.zeros(L, B, H, Tmax, kd, **kw))
        s.register_buffer("vc", torch.zeros(L, B, H, Tmax, kd, **kw))  # v zero-padded to k's width

    def encode(s, i, q, k, t):  # q, k [B, H, n, d]; t positions [n]
        c, sn = s.cos[t], s.sin[t]
        if s.pos == "rope":
            h = s.d // 2
            rot = lambda z: torch.cat([z[..., :h] * c - z[..., h:] * sn, z[..., :h] * sn + z[..., h:] * c], -1)
            return rot(q), rot(k)
        mq, mk = F.softplus(q.float()).to(q.dtype), F.softplus(k.float()).to(k.dtype)
        dl = s.delta[i].clamp(-2 * math.pi, 0)[None, :, None, :].to(q.dtype)
        cd, sd = dl.cos(), dl.sin()
        q2 = torch.cat([mq * c, mq * sn], -1)
        k2 = torch.cat([mk * (c * cd - sn * sd), mk * (sn * cd + c * sd)], -1)
        return q2, k2

    def forward(s, idx, t):  # idx [B, n] tokens at positions t [n]; fills the cache; logits of the last
        B, n = idx.shape
        x = s.wte[idx]
        Tmax = s.kc.shape[3]
        mask = (torch.arange(Tmax, device=idx.device)[None, :] <= t[:, None])  # [n, Tmax]
        for i in range(s.L):
            h = rms(x, s.n1[i])
            q, k, v = (h @ s.qkv[i].T).view(B, n, 3, s.H, s.d).permute(2, 0, 3, 1, 4)
            q, k = s.encode(i, q, k, t)
            if s.pos == "pope":
                v = F.pad(v, (0, s.d))
            s.kc[i].index_copy_(2, t, k)
            s.vc[i].index_copy_(2, t, v)
            y = sdpa(q, s.kc[i], s.vc[i], mask, 1 / math.sqrt(s.d))[..., : s.d]
            x = x + y.transpose(1, 2).reshape(B, n, s.C) @ s.proj[i].T
            x = x + F.gelu(rms(x, s.n2[i]) @ s.fc[i].T, approximate="tanh") @ s.fc2[i].T
        return (rms(x[:, -1], s.nf) @ s.wte.T).float()


SIZES = {"124m": (12, 768, 12), "253m": (16, 1024, 16), "774m": (36, 1280, 20)}


def bench(size, pos, B, P, N, rounds=3):
    torch.manual_seed(0)
    L, C, H = SIZES[size]
    m = Decoder(L, C, H, pos, P + N, B).eval()
    prompt = torch.randint(0, 50257, (B, P), device="cuda")
    step = torch.compile(m, mode="reduce-overhead", fullgraph=True)

    def generate():  # greedy: the prompt in one eager pass, then one compiled step per token
        torch.cuda.synchronize(); t0 = time.time()
        tok = m(prompt, torch.arange(P, device="cuda")).argmax(-1, keepdim=True)
        torch.cuda.synchronize(); t1 = time.time()
        for j in range(N):
            # Fresh step inputs of the warm-up's dtype, shape and strides, so that nothing recompiles.
            tok = step(tok, torch.tensor([P + j], device="cuda")).argmax(-1, keepdim=True)
        torch.cuda.synchronize(); t2 = time.time()
        return t1 - t0, t2 - t1

    with torch.no_grad():
        generate()  # compiles the step and records its CUDA graph; warms the eager prefill
        times = sorted(generate() for _ in range(rounds))
    prefill = sorted(t[0] for t in times)[rounds // 2]
    decode = sorted(t[1] for t in times)[rounds // 2]
    print(json.dumps({"kind": "decode_anchor", "size": size, "pos": pos, "batch": B, "prompt": P, "new": N,
                      "prefill_tok_s": round(B * P / prefill), "decode_tok_s": round(B * N / decode),
                      "decode_ms_per_step": round(1e3 * decode / N, 3)}), flush=True)


def check():  # CPU, fp32: decoding token by token equals one pass over the whole sequence
    torch.manual_seed(0)
    for pos in ("rope", "pope"):
        T = 12
        a = Decoder(2, 32, 2, pos, T, 1, V=97, dtype=torch.float32, device="cpu")
        b = Decoder(2, 32, 2, pos, T, 1, V=97, dtype=torch.float32, device="cpu")
        b.load_state_dict(a.state_dict())
        idx = torch.randint(0, 97, (1, T))
        with torch.no_grad():
            full = a(idx, torch.arange(T))
            for j in range(T):
                last = b(idx[:, j:j + 1], torch.tensor([j]))
        err = (full - last).abs().max().item()
        print(pos, "max |full - cached| =", err)
        assert err < 1e-4


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        check()
    else:
        a = sys.argv[1:] + [None] * 5
        bench(a[0] or "124m", a[1] or "rope", int(a[2] or 1), int(a[3] or 128), int(a[4] or 256))
