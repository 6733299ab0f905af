#!/usr/bin/env bash
# Issues 5 and 6's attention benchmark in one call on the GPU machine: pope-bench attention (fused
# kernels; nope, rope, pope, alibi and PJ-RoPE's full and pj_rotary at T = 1024, 4096, 10240, 16384,
# d = 64, H = 12, B = ⌊16384 / T⌋)
# and, in the same run, cuDNN through PyTorch SDPA (scripts/reference/attention_sdpa_bench.py,
# q/k 64 and 128 wide, v 64), then a side-by-side Markdown table of forward+backward ms last:
# ours per encoding, cuDNN at our q/k width, and the ratios the targets are stated in (pope vs
# rope; alibi, full and pj_rotary vs nope — issue 6 asks full ≤ 1.10× nope).
#
# Usage: scripts/bench_attention.sh
# Env:   OUT      logs and JSON numbers (default /tmp/pope_bench_attention)
#        BUILD    build directory holding src/pope-bench (default build/release)
#        LENGTHS  comma-separated T (default 1024,4096,10240,16384)
#        PYTHON   python with torch (default python3 on PATH, /opt/torch/.venv/bin first)
#        BENCH_ARGS  more pope-bench attention options, e.g. --atomic-dq
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-/tmp/pope_bench_attention}"
BUILD="${BUILD:-build/release}"
LENGTHS="${LENGTHS:-1024,4096,10240,16384}"
export PATH="/opt/torch/.venv/bin:$PATH"
PYTHON="${PYTHON:-python3}"
mkdir -p "$LOGS"
if [ ! -x "$BUILD/src/pope-bench" ]; then
  echo "bench_attention.sh: $BUILD/src/pope-bench not found; build it first (ninja -C $BUILD pope-bench)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
"$BUILD/src/pope-bench" attention --lengths "$LENGTHS" ${BENCH_ARGS:-} --json "$LOGS/pope_attention.json" | tee "$LOGS/pope_attention.txt"
"$PYTHON" scripts/reference/attention_sdpa_bench.py --lengths "$LENGTHS" --json "$LOGS/sdpa_cudnn.json" \
  | tee "$LOGS/sdpa_cudnn.txt"

"$PYTHON" - "$LOGS/pope_attention.json" "$LOGS/sdpa_cudnn.json" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))["rows"]
cudnn = {(r["qk_width"], r["seq_len"]): r for r in json.load(open(sys.argv[2]))["rows"]}
by = {(r["encoding"], r["seq_len"]): r for r in ours}
print("\n| encoding | T | ours fwd / bwd / f+b ms | cuDNN (same q/k width) f+b ms | ours / cuDNN | vs ours (rope or nope) |")
print("|---|---:|---|---:|---:|---:|")
for r in ours:
    ref = cudnn.get((r["qk_width"], r["seq_len"]))
    base = {"pope": "rope", "alibi": "nope", "full": "nope", "pj_rotary": "nope"}.get(r["encoding"])
    vs = by.get((base, r["seq_len"])) if base else None
    ratio = f"{r['forward_backward_ms'] / ref['forward_backward_ms']:.2f}" if ref else "-"
    own = f"{r['forward_backward_ms'] / vs['forward_backward_ms']:.2f} ({base})" if vs else "-"
    print(f"| {r['encoding']} | {r['seq_len']} | {r['forward_ms']:.3f} / {r['backward_ms']:.3f} / "
          f"{r['forward_backward_ms']:.3f} | {ref['forward_backward_ms']:.3f} | {ratio} | {own} |" if ref else
          f"| {r['encoding']} | {r['seq_len']} | {r['forward_backward_ms']:.3f} | - | - | {own} |")
PY
