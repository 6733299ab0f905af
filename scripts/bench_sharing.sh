#!/usr/bin/env bash
# Independent training runs sharing one GPU (docs/benchmarks.md, "Runs sharing a GPU"): for each
# count N in COUNTS, N runs of one config, seeds 1..N, each for STEPS steps without evaluations or
# checkpoints: N pope-train processes started together (MODE=processes) or one pope-train --seeds
# 1,…,N (MODE=seeds). A run's speed is its steps/s over its last half (log windows), and the
# aggregate is their sum. A table last.
# Usage: scripts/bench_sharing.sh [CONFIG]   (default indirect_indexing_pope)
# Env:   POPE_TRAIN  pope-train binary (default build/gpu/src/pope-train)
#        COUNTS ("1 2 4 8"), STEPS (4000), MODE (processes), DEVICE (cuda),
#        OUT (run directories, default /tmp/pope_sharing)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
CONFIG="${1:-indirect_indexing_pope}"
POPE_TRAIN="${POPE_TRAIN:-build/gpu/src/pope-train}"
COUNTS="${COUNTS:-1 2 4 8}"
STEPS="${STEPS:-4000}"
DEVICE="${DEVICE:-cuda}"
MODE="${MODE:-processes}"
case "$MODE" in processes | seeds) ;; *) echo "bench_sharing.sh: MODE is processes or seeds (got '$MODE')" >&2; exit 2 ;; esac
LOGS="${OUT:-/tmp/pope_sharing}"
PYTHON="${PYTHON:-python3}"
[ -x "$POPE_TRAIN" ] || { echo "bench_sharing.sh: $POPE_TRAIN not built" >&2; exit 2; }
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "bench_sharing.sh: STEPS takes a positive whole number (got '$STEPS')" >&2; exit 2; }
LOG_EVERY=$(( STEPS / 40 > 0 ? STEPS / 40 : 1 ))  # 40 windows a run
rows=()
for n in $COUNTS; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench_sharing.sh: COUNTS takes positive whole numbers (got '$n')" >&2; exit 2; }
  rm -rf "$LOGS/x$n" && mkdir -p "$LOGS/x$n"
  common=(--config "$CONFIG" --device "$DEVICE" --no-checkpoints --quiet --set train.steps="$STEPS"
          --set train.eval_every=0 --set train.log_every="$LOG_EVERY")
  pids=()
  if [ "$MODE" = seeds ]; then
    "$POPE_TRAIN" "${common[@]}" --out "$LOGS/x$n" --seeds "$(seq -s, 1 "$n")" >"$LOGS/x$n.txt" 2>&1 &
    pids+=($!)
  else
    for i in $(seq 1 "$n"); do
      "$POPE_TRAIN" "${common[@]}" --out "$LOGS/x$n/run$i" --set train.seed="$i" >"$LOGS/x$n/run$i.txt" 2>&1 &
      pids+=($!)
    done
  fi
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  [ "$failed" = 0 ] || { echo "bench_sharing.sh: a run of $n failed:"; tail -5 "$LOGS"/x"$n"*.txt "$LOGS"/x"$n"/*.txt 2>/dev/null; exit 1; }
  rows+=("$("$PYTHON" - "$n" "$LOGS/x$n" <<'PY'
import glob, json, sys
n, folder = int(sys.argv[1]), sys.argv[2]
speeds = []
for path in sorted(glob.glob(f"{folder}/*/metrics.jsonl")):
    lines = [json.loads(l) for l in open(path) if '"tokens_per_second"' in l]
    half = lines[len(lines) // 2:]
    config = json.load(open(path.replace("metrics.jsonl", "config.json")))
    tokens_per_step = config["train"]["batch_size"] * config["train"]["seq_len"]
    speeds.append(sum(l["tokens_per_second"] for l in half) / len(half) / tokens_per_step)
print(f"| {n} | {min(speeds):.0f}–{max(speeds):.0f} | {sum(speeds):.0f} |")
PY
)")
done
echo
echo "| runs ($MODE) | steps/s per run | aggregate steps/s |"
echo "|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
