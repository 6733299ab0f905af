#!/usr/bin/env python3
"""cuDNN causal attention through PyTorch SDPA, the comparator of `pope-bench attention`.

Same shapes as pope-bench attention: H heads, B = ⌊--tokens / T⌋, bf16, causal, q/k of width 64
(RoPE/NoPE-style: the rotation is a separate elementwise pass, not timed) and 128 (PoPE's
polar features), v of width --head-dim. The cuDNN backend is forced (an error if it cannot
run). Prints one line per (width, T) with fwd / bwd / fwd+bwd median ms (CUDA events) and
TFLOP/s with pope-bench's formula; --json writes the same numbers.
"""
import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(call, repeats):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, stop in zip(starts, stops):
        start.record()
        call()
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in zip(starts, stops))
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])


def bench(width, head_dim, seq_len, args):
    batch = args.tokens // seq_len
    gen = torch.Generator(device="cuda").manual_seed(1337)
    shape = (batch, args.heads, seq_len)
    q = (torch.rand(*shape, width, device="cuda", generator=gen) * 3 - 1.5).bfloat16().requires_grad_()
    k = (torch.rand(*shape, width, device="cuda", generator=gen) * 3 - 1.5).bfloat16().requires_grad_()
    v = (torch.rand(*shape, head_dim, device="cuda", generator=gen) * 3 - 1.5).bfloat16().requires_grad_()
    dout = (torch.rand(*shape, head_dim, device="cuda", generator=gen) * 2 - 1).bfloat16()
    scale = 1.0 / head_dim**0.5

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(args.warmup):
            forward().backward(dout)
        fwd = median_ms(forward, args.repeats)
        out = forward()
        bwd = median_ms(lambda: out.backward(dout, retain_graph=True), args.repeats)
        total = median_ms(lambda: forward().backward(dout), args.repeats)
    flops = 2.0 * batch * args.heads * (seq_len * seq_len / 2.0) * (width + head_dim)
    return {
        "impl": "torch_sdpa_cudnn",
        "qk_width": width,
        "head_dim": head_dim,
        "seq_len": seq_len,
        "batch": batch,
        "n_head": args.heads,
        "forward_ms": fwd,
        "backward_ms": bwd,
        "forward_backward_ms": total,
        "forward_tflops": flops / (fwd * 1e-3) / 1e12,
        "backward_tflops": 2.5 * flops / (bwd * 1e-3) / 1e12,
        "forward_backward_tflops": 3.5 * flops / (total * 1e-3) / 1e12,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,4096,10240,16384", help="comma-separated T, each ≤ --tokens")
    parser.add_argument("--widths", default="64,128", help="comma-separated q/k widths")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per run: B = tokens // T")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64, help="width of v")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
        widths = [int(x) for x in args.widths.split(",")]
    except ValueError:
        parser.error("--lengths and --widths take comma-separated integers")
    for seq_len in lengths:
        if seq_len <= 0 or seq_len > args.tokens:
            parser.error(f"sequence length {seq_len} must be in 1..--tokens ({args.tokens})")
    if not torch.cuda.is_available():
        print("attention_sdpa_bench: no CUDA device", file=sys.stderr)
        return 1
    rows = []
    print(f"{'impl':<17} {'W':>4} {'T':>6} | {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} | {'fwd TF':>7} {'bwd TF':>7} {'f+b TF':>7}")
    for width in widths:
        for seq_len in lengths:
            r = bench(width, args.head_dim, seq_len, args)
            rows.append(r)
            print(f"{r['impl']:<17} {width:>4} {seq_len:>6} | {r['forward_ms']:>8.3f} {r['backward_ms']:>8.3f} "
                  f"{r['forward_backward_ms']:>8.3f} | {r['forward_tflops']:>7.1f} {r['backward_tflops']:>7.1f} "
                  f"{r['forward_backward_tflops']:>7.1f}", flush=True)
    if args.json:
        directory = os.path.dirname(os.path.abspath(args.json))
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False) as tmp:
            json.dump({"benchmark": "attention_sdpa_cudnn", "torch": torch.__version__, "rows": rows}, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
