#!/usr/bin/env bash
# The indirect-indexing reproduction script end to end on the CPU with a shrunken model and
# task: two encodings × two seeds run concurrently, accuracy.csv / final.csv are written
# from the runs' metrics and test.csv from pope-eval on each run, a second call resumes,
# --summary only summarizes, bad arguments exit 2, and the plot script turns the CSV into a
# PNG (when gnuplot is installed).
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }
SCRIPT="$POPE_SOURCE_DIR/scripts/experiments/indirect_indexing.sh"
PLOT="$POPE_SOURCE_DIR/scripts/plot_accuracy.sh"
OUT="$SCRATCH/ii"

SMALL=(--set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.context_length=16
       --set train.seq_len=16 --set train.batch_size=8 --set train.micro_batch_size=8 --set train.eval_every=5
       --set train.log_every=5 --set train.threads=1 --set optim.warmup_steps=2
       --set data.indirect_indexing.max_len=6 --set data.indirect_indexing.min_len=4
       --set data.indirect_indexing.max_shift=2 --set data.indirect_indexing.val_size=40
       --set data.indirect_indexing.test_size=40)

expect_exit 0 "$SCRIPT" --bin "$TRAIN" --device cpu --out "$OUT" --encodings "rope pope" --seeds "1 2" --steps 10 -- "${SMALL[@]}"
expect_output "pope: final val accuracy"
expect_output "rope: final val accuracy"
expect_output "pope: test accuracy"
for run in rope_seed1 rope_seed2 pope_seed1 pope_seed2; do
  [ -f "$OUT/$run/config.json" ] || fail "no run directory for $run"
done
[ "$(head -n 1 "$OUT/accuracy.csv")" = "run,encoding,seed,step,val_accuracy,val_loss" ] || fail "accuracy.csv header"
# Evaluations at steps 0, 5 and 10 for each of the four runs.
[ "$(tail -n +2 "$OUT/accuracy.csv" | wc -l)" -eq 12 ] || { cat "$OUT/accuracy.csv" >&2; fail "expected 12 evaluations"; }
grep -q "^pope_seed2,pope,2,10," "$OUT/final.csv" || { cat "$OUT/final.csv" >&2; fail "final.csv lacks pope_seed2 at step 10"; }
[ "$(head -n 1 "$OUT/test.csv")" = "run,encoding,seed,step,test_accuracy" ] || fail "test.csv header"
[ "$(grep -c ',10,' "$OUT/test.csv")" -eq 4 ] || { cat "$OUT/test.csv" >&2; fail "test.csv: expected 4 runs at step 10"; }
# The two seeds of one encoding start from different weights.
[ "$(grep '^rope_seed1,rope,1,0,' "$OUT/accuracy.csv" | cut -d, -f6)" != \
  "$(grep '^rope_seed2,rope,2,0,' "$OUT/accuracy.csv" | cut -d, -f6)" ] || fail "seeds 1 and 2 gave the same initial loss"

# pope-eval --task: test-set accuracy of a run, overall and per shift, as JSON too.
EVAL="$POPE_BIN/pope-eval"
if [ -x "$EVAL" ]; then
  expect_exit 0 "$EVAL" --task indirect_indexing --checkpoint "$OUT/pope_seed1" --device cpu --json "$SCRATCH/ii.json"
  expect_output "test accuracy"
  python3 - "$SCRATCH/ii.json" <<'PY' || fail "pope-eval --task JSON: see above"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["examples"] == 40 and j["split"] == "test", j
assert 0.0 <= j["accuracy"] <= 1.0 and sum(v["examples"] for v in j["by_shift"].values()) == 40, j
assert set(j["by_shift"]) <= {"-2", "-1", "+1", "+2"}, j["by_shift"]
PY
  expect_exit 2 "$EVAL" --task indirect_indexing --checkpoint "$OUT/pope_seed1" --data "$OUT" --device cpu
  expect_output "takes no --data"
fi

# Again with more steps: every run resumes from its checkpoint at step 10.
expect_exit 0 "$SCRIPT" --bin "$TRAIN" --device cpu --out "$OUT" --encodings "rope pope" --seeds "1 2" --steps 15 -- "${SMALL[@]}"
grep -q "resumed from .*step_00000010 at step 10" "$OUT/pope_seed1/train.log" || fail "pope_seed1 did not resume"
grep -q "^rope_seed1,rope,1,15," "$OUT/final.csv" || { cat "$OUT/final.csv" >&2; fail "final.csv lacks step 15"; }

# --summary trains nothing (a larger --steps would otherwise resume) and writes the same tables.
cp "$OUT/final.csv" "$SCRATCH/final_before.csv"
expect_exit 0 "$SCRIPT" --bin "$TRAIN" --device cpu --out "$OUT" --encodings "rope pope" --seeds "1 2" --steps 20 --summary
expect_output "rope: test accuracy"
cmp -s "$OUT/final.csv" "$SCRATCH/final_before.csv" || fail "--summary changed final.csv (did it train?)"
[ "$(grep -c ',15,' "$OUT/test.csv")" -eq 4 ] || { cat "$OUT/test.csv" >&2; fail "test.csv: expected 4 runs at step 15"; }

# A run stopped by SIGTERM checkpoints; the script still evaluates and tabulates it, says how
# to continue, and exits 143 (not done) rather than 0 or 1.
"$SCRIPT" --bin "$TRAIN" --device cpu --out "$SCRATCH/stop" --encodings pope --seeds 1 --steps 100000 -- "${SMALL[@]}" \
  >"$SCRATCH/stop.log" 2>&1 &
script_pid=$!
for _ in $(seq 1 600); do
  grep -q '"event":"train"' "$SCRATCH/stop/pope_seed1/metrics.jsonl" 2>/dev/null && break
  sleep 0.1
done
for proc in /proc/[0-9]*; do  # the run's pope-train (the script's child), found by its run directory
  tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -q -- "--out $SCRATCH/stop/pope_seed1 " && kill -TERM "${proc#/proc/}"
done
set +e; wait "$script_pid"; code=$?; set -e
[ "$code" -eq 143 ] || { cat "$SCRATCH/stop.log" >&2; fail "a stopped run: exit $code, expected 143"; }
grep -q "stopped pope_seed1 by a signal" "$SCRATCH/stop.log" || { cat "$SCRATCH/stop.log" >&2; fail "no stop message"; }
grep -q "pope: test accuracy" "$SCRATCH/stop.log" || { cat "$SCRATCH/stop.log" >&2; fail "the stopped run was not evaluated"; }

# Bad arguments: exit 2 with the reason.
expect_exit 2 "$SCRIPT" --bin "$TRAIN" --encodings "sinusoid" --out "$OUT"
expect_output "indirect_indexing_sinusoid.json"
expect_exit 2 "$SCRIPT" --bin "$TRAIN" --seeds "one" --out "$OUT"
expect_output "not a non-negative integer"
expect_exit 2 "$SCRIPT" --frobnicate
expect_output "unknown argument"
# A failing run makes the script fail and shows why.
expect_exit 1 "$SCRIPT" --bin "$TRAIN" --device cpu --out "$SCRATCH/bad" --encodings pope --seeds 1 --steps 2 -- --set model.vocab_size=50
expect_output "FAILED pope_seed1"

expect_exit 2 "$PLOT" "$OUT/accuracy.csv"
if command -v gnuplot >/dev/null 2>&1; then
  expect_exit 0 "$PLOT" "$OUT/accuracy.csv" "$SCRATCH/accuracy.png"
  [ "$(head -c 4 "$SCRATCH/accuracy.png" | tail -c 3)" = "PNG" ] || fail "accuracy.png is not a PNG"
  expect_exit 1 "$PLOT" "$OUT/run_missing.csv" "$SCRATCH/x.png"
  expect_output "cannot read"
else
  echo "note: gnuplot not installed, plot check skipped"
fi
echo "PASS"
