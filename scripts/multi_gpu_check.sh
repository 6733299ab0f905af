#!/usr/bin/env bash
# Data-parallel checks on a machine with two GPUs (run by hand there; CI has no GPU):
#   1. parity: a small model for 30 steps on 1 GPU and on 2 ranks at the same global batch
#      (mpirun, and the torchrun-style environment launch with a file rendezvous); the loss
#      curves and final weights are compared (scripts/compare_runs.py), and the trainer itself
#      checks at every checkpoint that the ranks' weights are bit-identical;
#   2. faults: one rank killed (mpirun and environment launch) must end the job with an error
#      within a bounded time; SIGTERM to mpirun must checkpoint;
#      ZeRO-1 (train.zero_stage=1) against the same 1-GPU run, and its checkpoint resumed on 1 GPU;
#   3. scaling: tokens/s of 124M and 774M, RoPE and PoPE, on 1 GPU and on 2 GPUs with ZeRO-1 at the
#      same global batch; then 774M RoPE on 2 GPUs with the other gradient reductions (the
#      overlapped all-reduce without ZeRO-1, ZeRO-1's reduce-scatter after the backward), and the
#      device time per step phase of 774M RoPE on 1 and 2 GPUs (train.phase_timing).
# Prints a table last. Logs go to $OUT (or /tmp/pope_multi_gpu).
# Usage: scripts/multi_gpu_check.sh [--scaling-only | --no-faults] [--ranks N] [scaling steps (default 20)]
#   --scaling-only  section 3 alone;  --no-faults  sections 1 and 3 (the fault runs take minutes)
#   --ranks N       the scaling section on N GPUs (default 2; other than 2 with --scaling-only only:
#                   the parity and fault runs are written for two ranks)
set -uo pipefail
cd "$(dirname "$0")/.."
SCALING_ONLY=0 FAULTS=1 RANKS=2
while [ $# -gt 0 ]; do
  case "$1" in
    --scaling-only) SCALING_ONLY=1 FAULTS=0; shift ;;
    --no-faults) FAULTS=0; shift ;;
    --ranks) RANKS="${2:-}"; shift 2 || shift ;;
    *) break ;;
  esac
done
STEPS="${1:-20}"
if ! [[ "$RANKS" =~ ^[0-9]+$ ]] || [ "$RANKS" -lt 2 ]; then
  echo "multi_gpu_check: --ranks expects a whole number of GPUs ≥ 2, got '$RANKS'"; exit 2
fi
if [ "$RANKS" != 2 ] && [ "$SCALING_ONLY" = 0 ]; then
  echo "multi_gpu_check: --ranks $RANKS needs --scaling-only (the parity and fault runs are written for two ranks)"; exit 2
fi
if ! [[ "$STEPS" =~ ^[0-9]+$ ]] || [ "$STEPS" -lt 10 ]; then
  echo "multi_gpu_check: scaling steps expects a whole number ≥ 10 (tokens/s is logged every 10 steps), got '$STEPS'"; exit 2
fi
LOGS="${OUT:-/tmp/pope_multi_gpu}"
RUNS=/tmp/pope_multi_gpu_runs
mkdir -p "$LOGS"
rm -rf "$RUNS" && mkdir -p "$RUNS"
export PATH="/opt/torch/.venv/bin:$PATH" NCCL_NVLS_ENABLE=0 POPE_NCCL_TIMEOUT_S="${POPE_NCCL_TIMEOUT_S:-60}"
TRAIN=build/gpu/src/pope-train
MPIRUN=(mpirun -np 2 --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x POPE_NCCL_TIMEOUT_S -x PATH)
SCALE_MPIRUN=("${MPIRUN[@]}"); SCALE_MPIRUN[2]=$RANKS  # -np of the scaling section
declare -a ROWS

# Each row is printed as soon as it is known (a run cut short by a time limit keeps what it
# measured) and again in the table at the end.
row() { ROWS+=("| $1 | $2 |"); echo "| $1 | $2 |"; }
verdict() { if [ "$1" = 0 ]; then echo PASS; else echo FAIL; fi; }
since() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$1"; }

nvidia-smi --query-gpu=name --format=csv,noheader | tee "$LOGS/gpus.txt"
if [ "$(wc -l <"$LOGS/gpus.txt")" -lt "$RANKS" ]; then echo "multi_gpu_check: needs $RANKS GPUs"; exit 77; fi
if ! cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1; then
  tail -40 "$LOGS/configure.log"; exit 1
fi
grep "pope:" "$LOGS/configure.log"
if ! cmake --build build/gpu -j "$(nproc)" --target pope-train pope_gpu_tests >"$LOGS/build.log" 2>&1; then
  grep -E "error|FAILED" "$LOGS/build.log" | head -40; exit 1
fi
[ -f data/demo/train.bin ] || { echo "multi_gpu_check: data/demo/train.bin is missing (scripts/fetch_data.sh)"; exit 1; }
if [ "$SCALING_ONLY" = 0 ]; then
build/gpu/tests/pope_gpu_tests --gtest_filter='NcclCommunicator*' >"$LOGS/nccl_tests.log" 2>&1
row "NCCL communicator GPU tests" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOGS/nccl_tests.log" | tr '\n' ' ')"
# Overlapped buckets == one all-reduce (bitwise); ZeRO-1 == unsharded (bitwise without clipping).
build/gpu/tests/pope_gpu_tests --gtest_filter='NcclDataParallelStep*' >"$LOGS/nccl_step_tests.log" 2>&1
row "overlap and ZeRO-1 GPU tests" "$(verdict $?) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' \
  "$LOGS/nccl_step_tests.log" | tr '\n' ' ')"

# Small model, 30 steps, global batch 16 = 4 × accumulation 4 (1 rank) or 4 × 2 × 2 ranks.
SMALL=(--config configs/small_cpu.json --device cuda --set train.steps=30 --set train.batch_size=16
       --set train.micro_batch_size=4 --set train.log_every=1 --set train.eval_every=0
       --set train.checkpoint_every=10 --set optim.warmup_steps=5)

# ---- 1. parity -------------------------------------------------------------------------
for kind in pope rope; do
  $TRAIN "${SMALL[@]}" --set model.position.kind=$kind --out "$RUNS/one_$kind" >"$LOGS/parity_one_$kind.log" 2>&1
  "${MPIRUN[@]}" $TRAIN "${SMALL[@]}" --set model.position.kind=$kind --out "$RUNS/mpi_$kind" \
    >"$LOGS/parity_mpi_$kind.log" 2>&1
  rc=$?
  result=$(python3 scripts/compare_runs.py "$RUNS/one_$kind" "$RUNS/mpi_$kind" 2>&1)
  row "parity $kind: 1 GPU vs mpirun -np 2 (exit $rc)" "$result"
done
# ZeRO-1: the optimizer state sharded over the 2 ranks follows the same 1-GPU run; then its
# last checkpoint (moments gathered to rank 0) resumes on 1 GPU without ZeRO-1 to step 40.
"${MPIRUN[@]}" $TRAIN "${SMALL[@]}" --set train.zero_stage=1 --out "$RUNS/zero_pope" >"$LOGS/parity_zero_pope.log" 2>&1
rc=$?
result=$(python3 scripts/compare_runs.py "$RUNS/one_pope" "$RUNS/zero_pope" 2>&1)
compared=$?
row "parity pope: 1 GPU vs mpirun -np 2 ZeRO-1 (exit $rc)" "$(verdict $((rc + compared))) $result; \
$(grep -m1 -oE "optimizer state [^|]*" "$LOGS/parity_zero_pope.log")"
$TRAIN "${SMALL[@]}" --set train.steps=40 --resume auto --out "$RUNS/zero_pope" >"$LOGS/zero_resume_one.log" 2>&1
rc=$?
resumed=$(grep -m1 -oE "resumed from [^ ]+ at step 30" "$LOGS/zero_resume_one.log")
[ $rc = 0 ] && [ -n "$resumed" ]
row "ZeRO-1 checkpoint resumed on 1 GPU without ZeRO-1, to step 40" "$(verdict $?) exit $rc, ${resumed:-no resume line}"
# PJ-RoPE full (head_dim 64 for the fused kernels): ten positional tensors per layer, whose
# fp32 masters ZeRO-1 broadcasts from their shards' owners every step.
FULL=(--set model.position.kind=full --set model.n_head=2)
$TRAIN "${SMALL[@]}" "${FULL[@]}" --out "$RUNS/one_full" >"$LOGS/parity_one_full.log" 2>&1
"${MPIRUN[@]}" $TRAIN "${SMALL[@]}" "${FULL[@]}" --set train.zero_stage=1 --out "$RUNS/zero_full" \
  >"$LOGS/parity_zero_full.log" 2>&1
rc=$?
result=$(python3 scripts/compare_runs.py "$RUNS/one_full" "$RUNS/zero_full" 2>&1)
compared=$?
row "parity full: 1 GPU vs mpirun -np 2 ZeRO-1 (exit $rc)" "$(verdict $((rc + compared))) $result"

# The same without MPI: RANK/WORLD_SIZE/LOCAL_RANK and a file rendezvous.
rendezvous="$RUNS/rendezvous_parity"
pids=()
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank POPE_RENDEZVOUS="file:$rendezvous" \
    $TRAIN "${SMALL[@]}" --out "$RUNS/env_pope" >"$LOGS/parity_env_rank$rank.log" 2>&1 &
  pids+=($!)
done
rcs=""; for pid in "${pids[@]}"; do wait "$pid"; rcs="$rcs $?"; done
row "parity pope: 1 GPU vs env launch, file rendezvous (exit$rcs)" \
  "$(python3 scripts/compare_runs.py "$RUNS/one_pope" "$RUNS/env_pope" 2>&1)"

# ---- 2. faults -------------------------------------------------------------------------
if [ "$FAULTS" = 1 ]; then
LONG=(--config configs/small_cpu.json --device cuda --set train.steps=100000 --set train.log_every=1
      --set train.eval_every=0 --set train.checkpoint_every=0 --set train.batch_size=16)  # 8 × 2 ranks
wait_for_step() {  # run dir, step: waits (≤ 120 s) until metrics.jsonl logs that step
  for _ in $(seq 600); do
    grep -q "\"step\":$2[,}]" "$1/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
wait_bounded() {  # pid, seconds: sets RC to its exit code, or to HUNG (and kills it) after that long
  RC=HUNG
  for _ in $(seq $(($2 * 5))); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; RC=$?; return; fi
    sleep 0.2
  done
  kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null
}
rank_pid() {  # out dir, rank: the pid of that mpirun rank
  for pid in $(pgrep -f "pope-train.*$1"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$pid"; return; }
  done
}

"${MPIRUN[@]}" $TRAIN "${LONG[@]}" --out "$RUNS/fault_mpi" >"$LOGS/fault_mpi.log" 2>&1 &
launcher=$!
wait_for_step "$RUNS/fault_mpi" 5
victim=$(rank_pid "$RUNS/fault_mpi" 1)
start=$(date +%s.%N)
kill -9 "$victim"
wait_bounded "$launcher" 120; rc=$RC
row "fault: rank 1 killed under mpirun" \
  "mpirun exit $rc after $(since "$start") s; $(grep -m1 -oE "(process rank|rank) 1[^\"]{0,80}" "$LOGS/fault_mpi.log")"

rendezvous="$RUNS/rendezvous_fault"
pids=()
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank POPE_RENDEZVOUS="file:$rendezvous" POPE_NCCL_TIMEOUT_S=30 \
    $TRAIN "${LONG[@]}" --out "$RUNS/fault_env" >"$LOGS/fault_env_rank$rank.log" 2>&1 &
  pids+=($!)
done
wait_for_step "$RUNS/fault_env" 5
start=$(date +%s.%N)
kill -9 "${pids[1]}"
wait_bounded "${pids[0]}" 120; rc=$RC
row "fault: rank 1 killed, env launch (timeout 30 s)" \
  "rank 0 exit $rc after $(since "$start") s: $(grep -m1 -oE "rank 0 of 2: .{0,160}" "$LOGS/fault_env_rank0.log")"

"${MPIRUN[@]}" $TRAIN "${LONG[@]}" --out "$RUNS/sigterm_mpi" >"$LOGS/sigterm_mpi.log" 2>&1 &
launcher=$!
wait_for_step "$RUNS/sigterm_mpi" 5
kill -TERM "$launcher"
wait_bounded "$launcher" 120; rc=$RC
row "SIGTERM to mpirun" "exit $rc, checkpoint: $(ls "$RUNS/sigterm_mpi/checkpoints" 2>/dev/null | tail -1 || echo none)"

fi  # faults
fi  # not --scaling-only

# ---- 3. scaling ------------------------------------------------------------------------
tokens_per_second() {  # run dir: the last logged window's tokens/s
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
t=[x for x in r if x['event']=='train']; print(f\"{t[-1]['tokens_per_second']:.0f}\")" "$1/metrics.jsonl" 2>/dev/null \
    || echo 0
}
ratio() { python3 -c "print(f'{$1 / max($2, 1):.2f}')"; }
scale_args() {  # size kind: 1 micro-batch per GPU on RANKS GPUs, RANKS accumulated on 1
  local micro=32; [ "$1" = 774m ] && micro=16
  ARGS=(--no-checkpoints --config configs/owt_$1.json --device cuda --set data.train=data/demo/train.bin
        --set data.val=data/demo/val.bin --set model.position.kind=$2 --set train.steps="$STEPS"
        --set train.log_every=10 --set train.eval_every=0 --set train.checkpoint_every=0
        --set train.micro_batch_size=$micro --set train.batch_size=$((RANKS * micro)))
}
for size in 124m 774m; do
  for kind in rope pope; do
    scale_args $size $kind
    $TRAIN "${ARGS[@]}" --out "$RUNS/scale_one_${size}_$kind" >"$LOGS/scale_one_${size}_$kind.log" 2>&1
    "${SCALE_MPIRUN[@]}" $TRAIN "${ARGS[@]}" --set train.zero_stage=1 --out "$RUNS/scale_two_${size}_$kind" \
      >"$LOGS/scale_two_${size}_$kind.log" 2>&1
    one=$(tokens_per_second "$RUNS/scale_one_${size}_$kind")
    two=$(tokens_per_second "$RUNS/scale_two_${size}_$kind")
    row "scaling $size $kind, global batch ${ARGS[-1]#*=} × 1024" \
      "1 GPU $one tok/s, $RANKS GPUs ZeRO-1 $two tok/s, ×$(ratio "$two" "$one")"
  done
done

# 774M RoPE on RANKS GPUs with the other reductions, against the 1-GPU run above.
scale_args 774m rope
one=$(tokens_per_second "$RUNS/scale_one_774m_rope")
for variant in "train.zero_stage=0" "train.ddp_bucket_mb=0"; do
  name=${variant//[^a-z0-9]/_}
  "${SCALE_MPIRUN[@]}" $TRAIN "${ARGS[@]}" --set train.zero_stage=1 --set "$variant" --out "$RUNS/scale_two_774m_$name" \
    >"$LOGS/scale_two_774m_$name.log" 2>&1
  two=$(tokens_per_second "$RUNS/scale_two_774m_$name")
  row "scaling 774m rope, $RANKS GPUs, $(grep -m1 -oE "gradients: [^;]*" "$LOGS/scale_two_774m_$name.log")" \
    "$two tok/s, ×$(ratio "$two" "$one")"
done

# Where a step's time goes, 1 GPU against RANKS with ZeRO-1 (timed steps run eagerly).
phases() {  # run dir: the last window's mean ms per phase
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
p=[x for x in r if x['event']=='train'][-1]['phase_ms']; \
print(', '.join(f'{k} {v:.1f}' for k, v in p.items()) + f' (sum {sum(p.values()):.1f}) ms/step')" \
    "$1/metrics.jsonl" 2>/dev/null || echo "no phase_ms in $1/metrics.jsonl"
}
$TRAIN "${ARGS[@]}" --set train.phase_timing=true --out "$RUNS/phases_one_774m" >"$LOGS/phases_one_774m.log" 2>&1
row "phases 774m rope, 1 GPU" "$(phases "$RUNS/phases_one_774m")"
"${SCALE_MPIRUN[@]}" $TRAIN "${ARGS[@]}" --set train.zero_stage=1 --set train.phase_timing=true \
  --out "$RUNS/phases_two_774m" >"$LOGS/phases_two_774m.log" 2>&1
row "phases 774m rope, $RANKS GPUs ZeRO-1 (rank 0)" "$(phases "$RUNS/phases_two_774m")"

echo
echo "| check | result |"
echo "|---|---|"
printf '%s\n' "${ROWS[@]}"
