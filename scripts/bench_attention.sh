#!/usr/bin/env bash
# The attention benchmark in one call on the GPU machine: ROUNDS rounds of pope-bench attention
# --impl both, one process per encoding (fused kernels for nope, rope, pope, alibi, PJ-RoPE's full
# and pj_rotary, xpos and t5_bias, and cuDNN's fused SDPA in the same process on the same encoded
# q/k, at T = 1024, 4096, 10240, 16384, d = 64, H = 12, B = ⌊16384 / T⌋), the encodings' order
# rotated from round to round so that clock drift touches each alike; then cuDNN through PyTorch SDPA
# (scripts/reference/attention_sdpa_bench.py, q/k 64 and 128 wide, v 64: docs/benchmarks.md's
# anchors); last, scripts/attention_table.py's tables: median forward+backward ms per encoding and
# implementation, and the ratios the targets are stated in.
#
# Usage: scripts/bench_attention.sh
# Env:   OUT      logs and JSON numbers (default /tmp/pope_bench_attention)
#        BUILD    build directory holding src/pope-bench (default build/release)
#        LENGTHS  comma-separated T (default 1024,4096,10240,16384)
#        ROUNDS   pope-bench runs (default 3)
#        ENCODINGS  model.position.kind values, space-separated (default the list above;
#                 `build/release/src/pope-bench attention --help` names every one)
#        SDPA=0   skip PyTorch's SDPA (no torch on the machine)
#        PYTHON   python with torch (default python3 on PATH, /opt/torch/.venv/bin first)
#        BENCH_ARGS  more pope-bench attention options, e.g. --atomic-dq
set -euo pipefail
cd "$(dirname "$0")/.."
refuse() { echo "$1" >&2; exit 2; }
LOGS="${OUT:-/tmp/pope_bench_attention}"
BUILD="${BUILD:-build/release}"
LENGTHS="${LENGTHS:-1024,4096,10240,16384}"
ROUNDS="${ROUNDS:-3}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || refuse "bench_attention.sh: ROUNDS must be a whole number ≥ 1 (got '$ROUNDS')"
[[ "$LENGTHS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  refuse "bench_attention.sh: LENGTHS takes sequence lengths separated by commas, e.g. 1024,16384 (got '$LENGTHS')"
[ -x "$BUILD/src/pope-bench" ] ||
  refuse "bench_attention.sh: $BUILD/src/pope-bench not found; build it first (ninja -C $BUILD pope-bench)"
export PATH="/opt/torch/.venv/bin:$PATH"
PYTHON="${PYTHON:-python3}"
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"

# shellcheck disable=SC2206  # ENCODINGS is a list of names
encodings=(${ENCODINGS:-nope rope pope alibi full pj_rotary xpos t5_bias})
rounds=()
for round in $(seq 1 "$ROUNDS"); do
  shift_by=$(( (round - 1) % ${#encodings[@]} ))
  order=("${encodings[@]:shift_by}" "${encodings[@]:0:shift_by}")
  # One process per encoding, as training runs one: timed after the other encodings (and cuDNN)
  # in one process, `full` read up to 10% slower than alone at T = 10,240 and NoPE 6% faster
  # (docs/benchmarks.md, "Fused attention").
  for encoding in "${order[@]}"; do
    json="$LOGS/pope_attention_${round}_$encoding.json"
    # shellcheck disable=SC2086  # BENCH_ARGS holds several arguments
    "$BUILD/src/pope-bench" attention --impl both --encodings "$encoding" --lengths "$LENGTHS" \
      ${BENCH_ARGS:-} --json "$json" | tee "$LOGS/pope_attention_${round}_$encoding.txt"
    rounds+=("$json")
  done
done
sdpa=()
if [ "${SDPA:-1}" != 0 ]; then
  "$PYTHON" scripts/reference/attention_sdpa_bench.py --lengths "$LENGTHS" --json "$LOGS/sdpa_cudnn.json" \
    | tee "$LOGS/sdpa_cudnn.txt"
  sdpa=(--sdpa "$LOGS/sdpa_cudnn.json")
fi
python3 scripts/attention_table.py "${sdpa[@]}" "${rounds[@]}"
