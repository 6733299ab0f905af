#!/usr/bin/env bash
# One call on the GPU machine: build with CUDA, run the GPU and CPU test suites, train the
# 124M config for a few steps per encoding on the demo data, time pope-eval on the trained RoPE
# checkpoint at L = 1024 and 10240 over data/pg19_demo, resume a 124M run across train.precision
# (bf16 → fp8 and fp8 → bf16, on GPUs with FP8 tensor cores), and print a short table last.
# Logs go to $OUT (or /tmp/pope_gpu_check). Usage: scripts/gpu_check.sh [steps]
# Env: RUNS (size:encoding pairs to train, default "124m:rope 124m:pope 124m:full 774m:rope"),
#      SKIP_CPU_TESTS=1 (they run in CI).
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-30}"
LOGS="${OUT:-/tmp/pope_gpu_check}"
mkdir -p "$LOGS"
export PATH="/opt/torch/.venv/bin:$PATH" NCCL_NVLS_ENABLE=0
JOBS="$(nproc)"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
if ! cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1; then
  tail -40 "$LOGS/configure.log"; exit 1
fi
if ! cmake --build build/gpu -j "$JOBS" >"$LOGS/build.log" 2>&1; then
  grep -E "error|FAILED" "$LOGS/build.log" | head -40; exit 1
fi

ctest --test-dir build/gpu -L gpu --output-on-failure >"$LOGS/gpu_tests.log" 2>&1
[ "${SKIP_CPU_TESTS:-0}" = 1 ] || ctest --test-dir build/gpu -L cpu -j "$JOBS" >"$LOGS/cpu_tests.log" 2>&1
grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Exception|Timeout)" "$LOGS/gpu_tests.log" | head -20

# "124m:KIND" runs owt_124m (micro-batch 32 × 2), "774m:KIND" owt_774m (micro-batch 16, no
# accumulation, to keep the check short); the table shows the first and last logged losses.
declare -A tokens_per_second
if [ -f data/demo/train.bin ]; then
  for entry in ${RUNS:-124m:rope 124m:pope 124m:full 774m:rope}; do
    size=${entry%%:*} kind=${entry#*:}
    run="/tmp/pope_gpu_run_${size}_$kind"
    [ "$size" = 124m ] && run="/tmp/pope_gpu_run_$kind"  # pope-eval below reads the 124M RoPE run
    shape=()
    [ "$size" = 774m ] && shape=(--set train.micro_batch_size=16 --set train.batch_size=16)
    rm -rf "$run"
    build/gpu/src/pope-train --config "owt_$size" --device cuda --out "$run" \
      --set data.train=data/demo/train.bin --set data.val=data/demo/val.bin \
      --set model.position.kind=$kind --set train.steps="$STEPS" --set train.log_every=5 \
      --set train.eval_every=0 --set train.checkpoint_every=0 "${shape[@]}" >"$LOGS/train_${size}_$kind.log" 2>&1
    tail -2 "$LOGS/train_${size}_$kind.log"
    tokens_per_second["$size $kind"]=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
t=[x for x in r if x['event']=='train']; \
print(f\"{t[-1]['tokens_per_second']:.0f} tok/s, loss {t[0]['loss']:.3f} (step {t[0]['step']}) -> {t[-1]['loss']:.3f} (step {t[-1]['step']})\" if t else 'no steps')" \
      "$run/metrics.jsonl" 2>/dev/null || echo "failed")
  done
fi
# A run resumes in either precision: half the steps in one, the rest from its checkpoint in the other.
declare -A resumed
if [ -f data/demo/train.bin ] && [ "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)" -ge 89 ]; then
  half=$((STEPS / 2))
  for order in "bf16 fp8" "fp8 bf16"; do
    read -r first second <<<"$order"
    run="/tmp/pope_gpu_resume_${first}_$second"
    rm -rf "$run"
    common=(--config owt_124m --device cuda --out "$run" --set data.train=data/demo/train.bin
            --set data.val=data/demo/val.bin --set model.position.kind=rope --set train.steps="$STEPS"
            --set train.log_every=5 --set train.eval_every=0 --set train.checkpoint_every="$half")
    if build/gpu/src/pope-train "${common[@]}" --set train.precision="$first" --stop-at "$half" \
         >"$LOGS/resume_${first}_$second.log" 2>&1 &&
       build/gpu/src/pope-train "${common[@]}" --set train.precision="$second" --resume auto \
         >>"$LOGS/resume_${first}_$second.log" 2>&1; then
      resumed["$first → $second"]=$(python3 -c "import json,sys; t=[json.loads(l) for l in open(sys.argv[1])]; \
t=[x for x in t if x['event']=='train']; print(f\"steps {t[0]['step']}…{t[-1]['step']}, loss {t[0]['loss']:.3f} -> {t[-1]['loss']:.3f}\")" \
        "$run/metrics.jsonl" 2>/dev/null || echo "no metrics")
    else
      resumed["$first → $second"]="failed (see resume_${first}_$second.log)"
    fi
  done
fi
eval_summary="not run"
if [ -f /tmp/pope_gpu_run_rope/config.json ] && [ -d data/pg19_demo ]; then
  build/gpu/src/pope-eval --checkpoint /tmp/pope_gpu_run_rope --data data/pg19_demo --lengths 1024,10240 \
    --device cuda --json "$LOGS/eval.json" >"$LOGS/eval.log" 2>&1
  cat "$LOGS/eval.log" | tail -8
  eval_summary=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); \
print('; '.join(f\"L {x['length']}: {x['tokens_per_second'] or 0:,.0f} tok/s, ppl {x['perplexity'] or 0:.1f}\" for x in r['curves'][0]['results']))" \
    "$LOGS/eval.json" 2>/dev/null || echo "failed (see eval.log)")
fi
echo
echo "| check | result |"
echo "|---|---|"
echo "| GPU | $(cat "$LOGS/gpu.txt") |"
echo "| GPU tests | $(grep -E 'tests passed' "$LOGS/gpu_tests.log" || echo 'did not run') |"
echo "| CPU tests | $(grep -E 'tests passed' "$LOGS/cpu_tests.log" || echo 'did not run') |"
for run in "${!tokens_per_second[@]}"; do echo "| $run, $STEPS steps | ${tokens_per_second[$run]} |"; done
echo "| pope-eval 124M RoPE, data/pg19_demo | $eval_summary |"
for order in "${!resumed[@]}"; do echo "| 124M RoPE resumed $order, $STEPS steps | ${resumed[$order]} |"; done
