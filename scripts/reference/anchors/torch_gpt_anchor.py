# The PyTorch anchor of docs/benchmarks.md, kept unchanged so that its numbers stay comparable;
# scripts/bench_gpu.sh runs it beside pope-bench.
# Anchor: what a user would pick instead of a C++ trainer — a nanoGPT-style
# PyTorch GPT (RMSNorm, GELU MLP, tied embeddings) with torch.compile, bf16
# autocast, fused AdamW and SDPA attention. Measures training tokens/s for
# RoPE and PoPE (PoPE as real 2d-dim q/k through SDPA), and attention-only
# fwd+bwd times. Prints one JSON line per measurement.
import json, math, os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
dev = "cuda"


def emit(**kw):
    print(json.dumps(kw), flush=True)


class Attn(nn.Module):
    def __init__(s, C, H, T, pos):
        super().__init__()
        s.H, s.hd, s.pos = H, C // H, pos
        s.qkv = nn.Linear(C, 3 * C, bias=False)
        s.proj = nn.Linear(C, C, bias=False)
        hd = s.hd
        if pos == "rope":
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.outer(torch.arange(T).float(), inv)
            s.register_buffer("cos", f.cos(), persistent=False)
            s.register_buffer("sin", f.sin(), persistent=False)
        else:
            w = 10000 ** (-torch.arange(hd).float() / hd)
            f = torch.outer(torch.arange(T).float(), w)  # T, hd
            s.register_buffer("cos", f.cos(), persistent=False)
            s.register_buffer("sin", f.sin(), persistent=False)
            s.delta = nn.Parameter(torch.zeros(H, 1, hd))

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(x).view(B, T, 3, s.H, s.hd).permute(2, 0, 3, 1, 4)
        if s.pos == "rope":
            c, sn = s.cos[:T], s.sin[:T]
            def rot(z):
                z1, z2 = z[..., : s.hd // 2], z[..., s.hd // 2 :]
                return torch.cat([z1 * c - z2 * sn, z1 * sn + z2 * c], -1)
            q, k = rot(q), rot(k)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            c, sn = s.cos[:T], s.sin[:T]
            mq, mk = F.softplus(q), F.softplus(k)
            q2 = torch.cat([mq * c, mq * sn], -1)
            cd, sd = torch.cos(s.delta), torch.sin(s.delta)
            # cos(sw+d) = cos sw cos d - sin sw sin d ; sin(sw+d) = sin sw cos d + cos sw sin d
            k2 = torch.cat([mk * (c * cd - sn * sd), mk * (sn * cd + c * sd)], -1)
            vp = F.pad(v, (0, s.hd))  # flash needs equal head dims
            y = F.scaled_dot_product_attention(q2, k2, vp, is_causal=True,
                                               scale=1.0 / math.sqrt(s.hd))[..., : s.hd]
        return s.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(s, C, H, T, pos):
        super().__init__()
        s.n1, s.n2 = nn.RMSNorm(C), nn.RMSNorm(C)
        s.attn = Attn(C, H, T, pos)
        s.fc = nn.Linear(C, 4 * C, bias=False)
        s.fc2 = nn.Linear(4 * C, C, bias=False)

    def forward(s, x):
        x = x + s.attn(s.n1(x))
        return x + s.fc2(F.gelu(s.fc(s.n2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L, C, H, T, pos, V=50304):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.blocks = nn.ModuleList([Block(C, H, T, pos) for _ in range(L)])
        s.nf = nn.RMSNorm(C)
        s.head = nn.Linear(C, V, bias=False)
        s.head.weight = s.wte.weight
        for p in s.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(s, idx, tgt):
        x = s.wte(idx)
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.nf(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


SIZES = {"124m": (12, 768, 12), "253m": (16, 1024, 16), "774m": (36, 1280, 20)}


def train_bench(size, pos, B, T, steps, compile_=True):
    L, C, H = SIZES[size]
    torch.manual_seed(0)
    m = GPT(L, C, H, T, pos).to(dev)
    n = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fm = torch.compile(m) if compile_ else m
    x = torch.randint(0, 50257, (B, T), device=dev)
    y = torch.randint(0, 50257, (B, T), device=dev)
    t0 = time.time()
    for _ in range(3):
        with torch.autocast("cuda", torch.bfloat16):
            loss = fm(x, y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    warm = time.time() - t0
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(steps):
        with torch.autocast("cuda", torch.bfloat16):
            loss = fm(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
    e1.record(); torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / steps
    tok_s = B * T / (ms / 1e3)
    # model flops per token: 6N + attention 12*L*T*C (fwd+bwd, causal counted full as in PaLM)
    fl = 6 * n + 12 * L * T * C
    emit(kind="train", size=size, pos=pos, B=B, T=T, params=n, ms_per_step=round(ms, 2),
         tok_s=round(tok_s), tflops=round(fl * tok_s / 1e12, 1), mfu_vs_790=round(fl * tok_s / 790e12, 3),
         warm_s=round(warm, 1), loss=float(loss), peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))
    del m, opt, fm
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()


def attn_bench(B, H, T, hd, qkd):
    q = torch.randn(B, H, T, qkd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, H, T, qkd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, H, T, qkd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, H, T, qkd, device=dev, dtype=torch.bfloat16)
    def f():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(g)
    for _ in range(5): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(20): f()
    e1.record(); torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / 20
    # causal fwd+bwd flops: fwd 4*B*H*T*T*d/2, bwd 2.5x fwd
    fl = 3.5 * 4 * B * H * T * T * qkd / 2
    emit(kind="attn_sdpa", B=B, H=H, T=T, qkdim=qkd, ms_fwd_bwd=round(ms, 3), tflops=round(fl / ms / 1e9, 1))


if __name__ == "__main__":
    what = sys.argv[1:] or ["attn", "train"]
    emit(kind="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(), cc=torch.cuda.get_device_capability())
    if "attn" in what:
        for T in (1024, 4096):
            for qkd in (64, 128):
                attn_bench(max(1, 16 * 1024 // T), 12, T, 64, qkd)
    if "train" in what:
        for pos in ("rope", "pope"):
            train_bench("124m", pos, 32, 1024, 20)
    if "train774" in what:
        for pos in ("rope", "pope"):
            train_bench("774m", pos, 16, 1024, 10)
