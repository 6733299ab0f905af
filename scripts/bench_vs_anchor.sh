#!/usr/bin/env bash
# The training-throughput target (docs/benchmarks.md: ≥ 1.25× the PyTorch anchor) measured as
# docs/benchmarks.md reports it: `pope-bench train` and the anchor
# (scripts/reference/anchors/torch_gpt_anchor.py: torch.compile, bf16 autocast, fused AdamW, SDPA)
# alternately on one GPU, ROUNDS rounds of ours (RoPE, PoPE) then the anchor (RoPE, PoPE), random
# tokens, T = 1024. Rounds because the anchor's tokens/s vary more from run to run than ours
# (2–3% within one call); the table last gives every round and the median ratio.
#
# Usage: scripts/bench_vs_anchor.sh [124m] [774m]     (default 124m; B = 32 for 124M, 16 for 774M)
# Env:   OUT      logs and JSON (default /tmp/pope_vs_anchor)
#        BUILD    build directory holding src/pope-bench (default build/release)
#        ROUNDS   rounds (default 3)
#        PRECISIONS  train.precision values ours runs each round (default "bf16"; "bf16 fp8" adds FP8)
#        PYTHON   python with torch (default python3 on PATH, /opt/torch/.venv/bin first)
#        ANCHOR_TIMEOUT_S  limit per anchor call (default 300; its first call compiles)
#        POPE_BENCH_DEVICE=cpu POPE_BENCH_TINY=1   a dry run without a GPU (tiny shapes, no anchor)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(124m)
for size in "${SIZES[@]}"; do
  case "$size" in
    124m | 774m) ;;
    *) echo "bench_vs_anchor.sh: model size '$size' is not one the anchor runs (expected 124m or 774m)" >&2; exit 2 ;;
  esac
done
ROUNDS="${ROUNDS:-3}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_vs_anchor.sh: ROUNDS must be a whole number ≥ 1, got '$ROUNDS'" >&2; exit 2; }
read -r -a PRECISIONS <<<"${PRECISIONS:-bf16}"
[ ${#PRECISIONS[@]} -gt 0 ] || { echo "bench_vs_anchor.sh: PRECISIONS is empty (expected bf16 and/or fp8)" >&2; exit 2; }
for precision in "${PRECISIONS[@]}"; do
  case "$precision" in
    bf16 | fp8) ;;
    *) echo "bench_vs_anchor.sh: PRECISIONS holds '$precision' (expected bf16 or fp8)" >&2; exit 2 ;;
  esac
done
LOGS="${OUT:-/tmp/pope_vs_anchor}"
BUILD="${BUILD:-build/release}"
DEVICE="${POPE_BENCH_DEVICE:-cuda}"
export PATH="/opt/torch/.venv/bin:$PATH"
PYTHON="${PYTHON:-python3}"
BENCH="$BUILD/src/pope-bench"
[ -x "$BENCH" ] || { echo "bench_vs_anchor.sh: $BENCH not found; build it first (ninja -C $BUILD pope-bench)" >&2; exit 2; }
mkdir -p "$LOGS"

# shellcheck source=scripts/bench_steps.sh
source scripts/bench_steps.sh  # BENCH_STEPS, BENCH_TINY
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"

for round in $(seq 1 "$ROUNDS"); do
  for size in "${SIZES[@]}"; do
    micro=32 anchor_arg=train
    [ "$size" = 774m ] && micro=16 anchor_arg=train774
    for precision in "${PRECISIONS[@]}"; do
      for pos in rope pope; do
        json="$LOGS/ours_${size}_${pos}_${precision}_$round.json"
        "$BENCH" train --config "owt_$size" --device "$DEVICE" "${BENCH_STEPS[@]}" --set model.position.kind="$pos" \
          --set train.micro_batch_size="$micro" --set train.batch_size="$micro" --set train.seq_len=1024 \
          --set train.precision="$precision" "${BENCH_TINY[@]}" --json "$json" >"${json%.json}.txt" 2>&1 ||
          { echo "pope-bench $size $pos $precision failed:"; tail -5 "${json%.json}.txt"; }
      done
    done
    anchor="$LOGS/anchor_${size}_$round.jsonl"
    : >"$anchor"
    if [ "$DEVICE" = cuda ]; then
      timeout "${ANCHOR_TIMEOUT_S:-300}" "$PYTHON" scripts/reference/anchors/torch_gpt_anchor.py "$anchor_arg" \
        >"$anchor" 2>"${anchor%.jsonl}.err" || { echo "anchor $size failed or timed out:"; tail -5 "${anchor%.jsonl}.err"; }
    fi
  done
done

python3 - "$LOGS" "$ROUNDS" "${PRECISIONS[*]}" "${SIZES[@]}" <<'PY'
import json, os, statistics, sys

logs, rounds, precisions, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]


def ours_json(size, pos, precision, n):
    try:
        return json.load(open(os.path.join(logs, f"ours_{size}_{pos}_{precision}_{n}.json")))
    except (OSError, json.JSONDecodeError):
        return {}


def ours(size, pos, precision, n):
    return ours_json(size, pos, precision, n).get("tokens_per_second")


def peak_gib(size, pos, precision):
    peaks = [ours_json(size, pos, precision, n).get("device_memory_bytes") for n in range(1, rounds + 1)]
    peaks = [p for p in peaks if p is not None]
    return f"{max(peaks) / 2**30:.1f}" if peaks else "n/a"


def anchor(size, pos, n):
    try:
        for line in open(os.path.join(logs, f"anchor_{size}_{n}.jsonl")):
            r = json.loads(line)
            if r.get("kind") == "train" and r.get("pos") == pos:
                return r["tok_s"]
    except (OSError, json.JSONDecodeError):
        pass
    return None


def cells(values, spec):
    return " · ".join(format(v, spec) if v is not None else "n/a" for v in values)


print(f"\n| config | precision | ours tok/s, rounds 1–{rounds} | anchor tok/s (bf16) | ours / anchor per round | median ratio | ours peak GiB |")
print("|---|---|---|---|---|---:|---:|")
for size in sizes:
    for pos in ("rope", "pope"):
        theirs = [anchor(size, pos, n) for n in range(1, rounds + 1)]
        for precision in precisions:
            mine = [ours(size, pos, precision, n) for n in range(1, rounds + 1)]
            ratios = [a / b if a and b else None for a, b in zip(mine, theirs)]
            known = [r for r in ratios if r is not None]
            median = format(statistics.median(known), ".3f") if known else "n/a"
            print(f"| {size.upper()} {pos} | {precision} | {cells(mine, ',.0f')} | {cells(theirs, ',.0f')} | "
                  f"{cells(ratios, '.3f')} | {median} | {peak_gib(size, pos, precision)} |")
PY
