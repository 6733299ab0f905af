#!/usr/bin/env bash
# The indirect-indexing reproduction (the PoPE paper's setup): trains every (encoding, seed) pair
# concurrently on one GPU machine (runs spread round-robin over its GPUs; the 25M-parameter
# model leaves one H200 mostly idle, so several runs share a GPU), then writes
#   OUT/<encoding>_seed<seed>/     run directory (config, metrics.jsonl, train.log, checkpoints)
#   OUT/accuracy.csv               run,encoding,seed,step,val_accuracy,val_loss (every evaluation)
#   OUT/final.csv                  run,encoding,seed,step,val_accuracy (the last evaluation of each run)
#   OUT/test.csv                   run,encoding,seed,step,test_accuracy (pope-eval --task indirect_indexing
#                                  on each run's newest checkpoint: the paper's Table 1 measure)
# and prints the mean ± std of the final validation and test accuracy per encoding. Plot with
#   scripts/plot_accuracy.sh OUT/accuracy.csv accuracy.png      (needs gnuplot: the dev machine)
# Runs continue from their newest checkpoint when the script is started again (--resume auto),
# so a time-sliced job can be repeated until every run reaches train.steps: a run stopped by
# SIGTERM or SIGINT checkpoints, the script still writes the tables and exits 143 (not done);
# a run that failed makes it exit 1.
#
# Usage: scripts/experiments/indirect_indexing.sh [options] [-- --set key=value ...]
#   --out DIR            output directory (default runs/indirect_indexing)
#   --encodings "LIST"   of pope rope rope_half alibi_half (default "rope pope")
#   --seeds "LIST"       train.seed values (default "1 2 3"); the data set (data.indirect_indexing.seed)
#                        stays fixed, so seeds differ in initialisation and training order only
#   --steps N            override train.steps (default: the configs' 100000)
#   --stop-at N          pass --stop-at N to every run (checkpoint and exit there)
#   --bin PATH           pope-train binary (default: build/gpu/src/pope-train, else build/release/src/pope-train)
#   --device DEV         auto | cpu | cuda (default auto)
#   --summary            train nothing: write the CSVs and the test accuracy of what OUT holds now
#                        (runs still training elsewhere included: their newest checkpoint is evaluated)
# Everything after `--` is passed to every pope-train call.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

OUT="runs/indirect_indexing"
ENCODINGS="rope pope"
SEEDS="1 2 3"
STEPS=""
STOP_AT=""
BIN=""
DEVICE="auto"
SUMMARY=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --encodings) ENCODINGS="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --stop-at) STOP_AT="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --summary) SUMMARY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "indirect_indexing.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ -z "$BIN" ]; then
  for candidate in build/gpu/src/pope-train build/release/src/pope-train; do
    if [ -x "$candidate" ]; then BIN="$candidate"; break; fi
  done
fi
if [ -z "$BIN" ] || [ ! -x "$BIN" ]; then
  echo "indirect_indexing.sh: no pope-train binary (build first, or pass --bin PATH)" >&2
  exit 2
fi
EVAL_BIN="$(dirname "$BIN")/pope-eval"
if [ ! -x "$EVAL_BIN" ]; then
  echo "indirect_indexing.sh: no pope-eval beside $BIN (build it too)" >&2
  exit 2
fi
for encoding in $ENCODINGS; do
  if [ ! -f "configs/indirect_indexing_$encoding.json" ]; then
    echo "indirect_indexing.sh: no config configs/indirect_indexing_$encoding.json (encodings: pope rope rope_half alibi_half)" >&2
    exit 2
  fi
done
for value in $SEEDS $STEPS $STOP_AT; do
  case "$value" in
    ''|*[!0-9]*) echo "indirect_indexing.sh: '$value' is not a non-negative integer (--seeds, --steps, --stop-at)" >&2; exit 2 ;;
  esac
done

GPUS=1
if [ "$DEVICE" != "cpu" ] && command -v nvidia-smi >/dev/null 2>&1; then
  GPUS="$(nvidia-smi --list-gpus 2>/dev/null | wc -l)"
  [ "$GPUS" -ge 1 ] || GPUS=1
fi
mkdir -p "$OUT"

# Launch every run in the background; each run's console output goes to OUT/<run>.console.
failed=0
stopped=0
if [ "$SUMMARY" = 0 ]; then
  declare -A PIDS
  index=0
  for encoding in $ENCODINGS; do
    for seed in $SEEDS; do
      run="${encoding}_seed${seed}"
      args=(--config "configs/indirect_indexing_$encoding.json" --out "$OUT/$run" --resume auto
            --device "$DEVICE" --quiet --set "train.seed=$seed")
      [ -n "$STEPS" ] && args+=(--set "train.steps=$STEPS")
      [ -n "$STOP_AT" ] && args+=(--stop-at "$STOP_AT")
      CUDA_VISIBLE_DEVICES="$((index % GPUS))" "$BIN" "${args[@]}" "${EXTRA[@]}" >"$OUT/$run.console" 2>&1 &
      PIDS[$run]=$!
      echo "started $run (pid ${PIDS[$run]}, GPU $((index % GPUS)))"
      index=$((index + 1))
    done
  done

  for run in "${!PIDS[@]}"; do
    if wait "${PIDS[$run]}"; then
      echo "finished $run"
    else
      status=$?
      if [ "$status" = 143 ] || [ "$status" = 130 ]; then
        echo "stopped $run by a signal (exit $status), checkpointed: start the script again to continue it" >&2
        stopped=1
      else
        echo "FAILED $run (exit $status); last lines of $OUT/$run.console:" >&2
        tail -5 "$OUT/$run.console" >&2
        failed=1
      fi
    fi
  done
fi

# The test split, on each run's newest checkpoint (a run still training elsewhere keeps
# writing new ones; the evaluation reads a complete one).
for encoding in $ENCODINGS; do
  for seed in $SEEDS; do
    run="${encoding}_seed${seed}"
    [ -d "$OUT/$run/checkpoints" ] || continue
    if ! "$EVAL_BIN" --task indirect_indexing --checkpoint "$OUT/$run" --device "$DEVICE" \
      --json "$OUT/$run/test.json" >"$OUT/$run.test.console" 2>&1; then
      echo "test evaluation of $run failed; see $OUT/$run.test.console" >&2
      failed=1
    fi
  done
done

# metrics.jsonl and test.json → CSV, and the per-encoding summary of the last evaluation.
python3 - "$OUT" $ENCODINGS -- $SEEDS <<'PY'
import csv, json, math, os, sys
out = sys.argv[1]
split = sys.argv.index("--")
encodings, seeds = sys.argv[2:split], sys.argv[split + 1:]
rows, finals, tests = [], [], []
for encoding in encodings:
    for seed in seeds:
        run = f"{encoding}_seed{seed}"
        path = os.path.join(out, run, "metrics.jsonl")
        if not os.path.exists(path):
            continue
        evals = {}
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if record.get("event") == "eval" and "val_accuracy" in record:
                    evals[record["step"]] = record  # a resumed run may repeat a step: keep the last
        for step in sorted(evals):
            r = evals[step]
            rows.append([run, encoding, seed, step, f"{r['val_accuracy']:.6f}", f"{r['val_loss']:.6f}"])
        if evals:
            last = evals[max(evals)]
            finals.append([run, encoding, seed, last["step"], last["val_accuracy"]])
        test_path = os.path.join(out, run, "test.json")
        if os.path.exists(test_path):
            with open(test_path) as f:
                test = json.load(f)
            tests.append([run, encoding, seed, test["step"], test["accuracy"]])
for name, header, data in (("accuracy.csv", ["run", "encoding", "seed", "step", "val_accuracy", "val_loss"], rows),
                           ("final.csv", ["run", "encoding", "seed", "step", "val_accuracy"], finals),
                           ("test.csv", ["run", "encoding", "seed", "step", "test_accuracy"], tests)):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(data)
    os.replace(tmp, os.path.join(out, name))
print(f"wrote {os.path.join(out, 'accuracy.csv')} ({len(rows)} evaluations), final.csv and test.csv")
def summarize(label, table):
    for encoding in encodings:
        values = [100 * r[4] for r in table if r[1] == encoding]
        if not values:
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        steps = sorted({r[3] for r in table if r[1] == encoding})
        print(f"{encoding:>10}: {label} accuracy {mean:6.2f} ± {std:5.2f} % over {len(values)} seed(s), step(s) {steps}")
summarize("final val", finals)
summarize("test", tests)
PY
if [ "$failed" = 1 ]; then exit 1; fi
if [ "$stopped" = 1 ]; then exit 143; fi
exit 0
