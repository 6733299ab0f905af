#!/usr/bin/env bash
# A change against its base in one call on the GPU machine, the way docs/benchmarks.md compares
# kernels: the working tree ("new") and a copy of it with PATCH reversed ("base") are built side
# by side; then optionally the GPU tests on new; then Nsight Compute's time of every kernel of one
# attention forward+backward per encoding at the 124M training shape (and at other lengths if
# asked), on both trees; then `pope-bench attention` at LENGTHS if set, and `pope-bench train` per
# encoding, the trees alternating within each round so that drifting clocks touch both alike.
# Short tables last.
#
# Usage: scripts/ab_gpu.sh PATCH
#   PATCH: the change as a patch against the working tree's base, made on the development machine,
#   e.g. `git diff main > build/ab/change.patch` (carry build/ab to the GPU machine).
# Env:   OUT        logs and JSON (default /tmp/pope_ab)
#        ENCODINGS  model.position.kind values to time (default "rope pope")
#        NEW_ENCODINGS  more values to time on new alone (encodings the base does not have)
#        TRAIN_ENCODINGS  the values pope-bench train runs (default ENCODINGS and NEW_ENCODINGS)
#        ROUNDS     pope-bench rounds (default 2; 0: no train rounds)
#        LENGTHS    also pope-bench attention rounds at these T (comma-separated, e.g.
#                   1024,4096,10240,16384; B·T = 16,384): forward and f+b ms per tree
#        NCU_LENGTHS  T of the Nsight Compute tables (default 1024: B = MICRO; longer T: B·T = 16,384)
#        CONFIG     pope-bench config (default owt_124m), MICRO its micro-batch (default 32)
#        TESTS=1    run pope_gpu_tests (without the NCCL ones) on new first
#        NCU=0      skip the Nsight Compute tables (they need ncu on PATH)
#        JOBS       build jobs per tree (default: half the cores)
#        POPE_BENCH_DEVICE=cpu POPE_BENCH_TINY=1   a dry run of the script without a GPU (tiny
#                   shapes, no ncu); CMAKE_ARGS="-DPOPE_ENABLE_CUDA=OFF" builds CPU-only trees
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
refuse() { echo "$1" >&2; exit 2; }
[ $# -eq 1 ] || refuse "usage: scripts/ab_gpu.sh PATCH (one patch of the change against its base; got $# arguments)"
LOGS="${OUT:-/tmp/pope_ab}"
LENGTHS="${LENGTHS:-}"
NCU_LENGTHS="${NCU_LENGTHS:-1024}"
ENCODINGS="${ENCODINGS:-rope pope}"
NEW_ENCODINGS="${NEW_ENCODINGS:-}"
TRAIN_ENCODINGS="${TRAIN_ENCODINGS:-$ENCODINGS${NEW_ENCODINGS:+ $NEW_ENCODINGS}}"
declare -A TREE_ENCODINGS=([base]="$ENCODINGS" [new]="$ENCODINGS${NEW_ENCODINGS:+ $NEW_ENCODINGS}")
ROUNDS="${ROUNDS:-2}"
CONFIG="${CONFIG:-owt_124m}"
MICRO="${MICRO:-32}"
DEVICE="${POPE_BENCH_DEVICE:-cuda}"
JOBS="${JOBS:-$(( ($(nproc) + 1) / 2 ))}"
[[ "$ROUNDS" =~ ^[0-9]+$ ]] || refuse "ab_gpu.sh: ROUNDS must be a whole number ≥ 0 (got '$ROUNDS')"
[[ "$MICRO" =~ ^[1-9][0-9]*$ ]] || refuse "ab_gpu.sh: MICRO must be a positive whole number (got '$MICRO')"
for lengths in "$LENGTHS" "$NCU_LENGTHS"; do
  [[ -z "$lengths" || "$lengths" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
    refuse "ab_gpu.sh: LENGTHS and NCU_LENGTHS take sequence lengths separated by commas, e.g. 1024,16384 (got '$lengths')"
done
PATCH="$1"
[ -f "$PATCH" ] || refuse "ab_gpu.sh: patch '$PATCH' not found"
PATCH="$(cd "$(dirname "$PATCH")" && pwd)/$(basename "$PATCH")"
# Checked against this tree before anything is copied, built or written.
patch -R -p1 -s -f --dry-run <"$PATCH" >/dev/null 2>&1 ||
  refuse "ab_gpu.sh: $PATCH does not reverse cleanly out of this tree (make it with git diff BASE, against this tree's base)"
export PATH="/opt/torch/.venv/bin:$PATH"
mkdir -p "$LOGS"

# shellcheck source=scripts/bench_steps.sh
source scripts/bench_steps.sh  # BENCH_STEPS, BENCH_TINY
SHAPE=(--set train.micro_batch_size="$MICRO" --set train.batch_size="$MICRO" --set train.seq_len=1024 "${BENCH_TINY[@]}")

# The base tree: this tree's sources (not its builds, data or .git) with the change taken out.
base_src=build/ab_base_src
rm -rf "$base_src" && mkdir -p "$base_src"
tar --exclude=./build --exclude=./.git --exclude=./data -cf - . | tar -xf - -C "$base_src"
(cd "$base_src" && patch -R -p1 -s -f <"$PATCH") || { echo "ab_gpu.sh: reversing $PATCH in $base_src failed" >&2; exit 1; }

build() {  # build DIR SOURCE TARGET...
  local dir=$1 src=$2 name
  name=$(basename "$dir")
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    # shellcheck disable=SC2086  # CMAKE_ARGS holds several arguments
    cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >"$LOGS/configure_$name.log" 2>&1 ||
      { echo "configure failed ($dir):"; tail -20 "$LOGS/configure_$name.log"; return 1; }
  fi
  cmake --build "$dir" -j "$JOBS" --target "$@" >"$LOGS/build_$name.log" 2>&1 ||
    { echo "build failed ($dir):"; grep -E "error|FAILED" "$LOGS/build_$name.log" | head -20; return 1; }
}
new_targets=(pope-bench)
[ "${TESTS:-0}" = 1 ] && new_targets+=(pope_gpu_tests)
build build/ab_new . "${new_targets[@]}" & new_build=$!
build build/ab_base "$base_src" pope-bench & base_build=$!
wait $new_build || exit 1
wait $base_build || exit 1
declare -A BENCH=([base]=build/ab_base/src/pope-bench [new]=build/ab_new/src/pope-bench)

tests_summary="not run"
if [ "${TESTS:-0}" = 1 ]; then
  build/ab_new/tests/pope_gpu_tests --gtest_filter='-*Nccl*' >"$LOGS/gpu_tests.log" 2>&1
  tests_summary="$(grep -E '^\[  (PASSED|FAILED)  \]' "$LOGS/gpu_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$LOGS/gpu_tests.log" | head -20
fi

# Nsight Compute: mean µs per kernel name over one warmup and two timed f+b calls.
kernel_tables=""
if [ "${NCU:-1}" = 1 ] && [ "$DEVICE" = cuda ] && command -v ncu >/dev/null; then
  for T in ${NCU_LENGTHS//,/ }; do
    tokens=$((T == 1024 ? MICRO * 1024 : (T > 16384 ? T : 16384)))
    for encoding in $ENCODINGS; do
      for tree in base new; do
        ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw "${BENCH[$tree]}" attention \
          --encodings "$encoding" --lengths "$T" --tokens "$tokens" --warmup 1 --repeats 2 \
          >"$LOGS/ncu_${encoding}_${T}_$tree.csv" 2>"$LOGS/ncu_${encoding}_${T}_$tree.err"
      done
      kernel_tables+="$(python3 - "$LOGS/ncu_${encoding}_${T}_base.csv" "$LOGS/ncu_${encoding}_${T}_new.csv" \
        "$encoding, T = $T, B = $((tokens / T))" <<'PY'
import collections, csv, io, re, sys

def kernel_means(path):
    text = open(path).read()
    if '"ID"' not in text:
        return {}  # ncu failed: its .err file beside the CSV says why
    rows = list(csv.reader(io.StringIO(text[text.find('"ID"'):])))
    name, duration = rows[0].index("Kernel Name"), rows[0].index("gpu__time_duration.sum")
    unit = rows[1][duration]  # nanoseconds or microseconds
    times = collections.defaultdict(list)
    for row in rows[2:]:
        value = float(row[duration].replace(",", ""))
        kernel = re.sub(r"^(void )?(unnamed>::)?", "", row[name].split("(")[0])  # ncu's "void unnamed>::k<…>"
        times[kernel].append(value / 1000 if unit.startswith("n") else value)
    return {k: sum(v) / len(v) for k, v in times.items()}

base, new = kernel_means(sys.argv[1]), kernel_means(sys.argv[2])
print(f"\n| {sys.argv[3]} kernel (µs per call) | base | new |\n|---|---:|---:|")
for kernel in sorted(set(base) | set(new)):
    cell = lambda table: f"{table[kernel]:.1f}" if kernel in table else "–"
    print(f"| `{kernel}` | {cell(base)} | {cell(new)} |")
print(f"| all | {sum(base.values()):.1f} | {sum(new.values()):.1f} |")
PY
)"
    done
  done
fi

# pope-bench attention at LENGTHS, trees alternating per round; medians per tree.
attention_table=""
if [ -n "$LENGTHS" ] && [ "$DEVICE" = cuda ]; then
  for round in $(seq 1 "$(( ROUNDS > 0 ? ROUNDS : 1 ))"); do
    for tree in base new; do
      encodings="${TREE_ENCODINGS[$tree]}"
      "${BENCH[$tree]}" attention --encodings "${encodings// /,}" --lengths "$LENGTHS" \
        --json "$LOGS/attention_${tree}_$round.json" >"$LOGS/attention_${tree}_$round.txt" 2>&1 ||
        { echo "pope-bench attention $tree failed:"; tail -5 "$LOGS/attention_${tree}_$round.txt"; }
    done
  done
  attention_table="$(python3 - "$LOGS" <<'PY'
import glob, json, statistics, sys

def medians(tree):
    values = {}
    for path in sorted(glob.glob(f"{sys.argv[1]}/attention_{tree}_*.json")):
        for row in json.load(open(path))["rows"]:
            for phase in ("forward_ms", "forward_backward_ms"):
                values.setdefault((row["encoding"], row["seq_len"], phase), []).append(row[phase])
    return {key: statistics.median(v) for key, v in values.items()}

base, new = medians("base"), medians("new")
print("\n| pope-bench attention, median ms | T | forward base → new | f+b base → new |\n|---|---:|---|---|")
for encoding, T in sorted({(e, t) for e, t, _ in base} | {(e, t) for e, t, _ in new}):
    cell = lambda phase: " → ".join(f"{table[(encoding, T, phase)]:.3f}" if (encoding, T, phase) in table else "–"
                                    for table in (base, new))
    print(f"| {encoding} | {T} | {cell('forward_ms')} | {cell('forward_backward_ms')} |")
PY
)"
elif [ -n "$LENGTHS" ]; then
  attention_table="(pope-bench attention needs a CUDA device: LENGTHS skipped)"
fi

declare -A RESULTS
for round in $(seq 1 "$ROUNDS"); do
  for encoding in $TRAIN_ENCODINGS; do
    for tree in base new; do
      [[ " ${TREE_ENCODINGS[$tree]} " == *" $encoding "* ]] || { RESULTS["$encoding $tree"]="–"; continue; }
      json="$LOGS/train_${encoding}_${tree}_$round.json"
      "${BENCH[$tree]}" train --config "$CONFIG" --device "$DEVICE" "${BENCH_STEPS[@]}" "${SHAPE[@]}" \
        --set model.position.kind="$encoding" --json "$json" >"${json%.json}.txt" 2>&1 ||
        { echo "pope-bench $tree $encoding failed:"; tail -5 "${json%.json}.txt"; }
      value=$(python3 -c "import json, sys; print(f\"{json.load(open(sys.argv[1]))['tokens_per_second']:,.0f}\")" \
        "$json" 2>/dev/null || echo failed)
      RESULTS["$encoding $tree"]+="${RESULTS["$encoding $tree"]:+ · }$value"
    done
  done
done

echo "$kernel_tables"
echo "$attention_table"
echo
if [ "$ROUNDS" -gt 0 ]; then
  echo "| pope-bench train $CONFIG, tok/s per round | base | new |"
  echo "|---|---|---|"
  for encoding in $TRAIN_ENCODINGS; do
    echo "| $encoding | ${RESULTS["$encoding base"]} | ${RESULTS["$encoding new"]} |"
  done
fi
echo "GPU tests on new: $tests_summary"
