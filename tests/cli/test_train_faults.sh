#!/usr/bin/env bash
# pope-train under faults that must never lose work: SIGHUP stops with a checkpoint like SIGTERM;
# kill -9 while checkpoints are written and pruned leaves only complete ones, and resume works.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }

write_tiny_config "$SCRATCH/tiny.json" '"steps": 20, "eval_every": 0, "checkpoint_every": 0'

# wait_for_steps RUN_DIR N: until metrics.jsonl holds N training records (at most 30 s).
wait_for_steps() {
  for _ in $(seq 1 300); do
    [ "$(grep -c '"event":"train"' "$1/metrics.jsonl" 2>/dev/null || true)" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "$1 did not reach $2 logged steps"
}

# SIGHUP: the step finishes, a checkpoint is written, exit 143 as for SIGTERM. A shell started
# with SIGHUP ignored (nohup) passes that on, and then the trainer rightly ignores it too.
if [ $(( 0x$(awk '/^SigIgn:/ {print $2}' /proc/$$/status) & 1 )) -eq 0 ]; then
  "$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --out "$SCRATCH/hup" -q >"$SCRATCH/hup.log" 2>&1 &
  pid=$!
  wait_for_steps "$SCRATCH/hup" 2
  kill -HUP "$pid"
  set +e; wait "$pid"; code=$?; set -e
  [ "$code" -eq 143 ] || { cat "$SCRATCH/hup.log" >&2; fail "SIGHUP exit code $code, expected 143"; }
  ls "$SCRATCH/hup/checkpoints" | grep -q '^step_' || fail "no checkpoint after SIGHUP"
  grep -q "stopped by signal 1 after step" "$SCRATCH/hup.log" || { cat "$SCRATCH/hup.log" >&2; fail "no stop message"; }
else
  echo "note: SIGHUP is ignored in this shell (nohup); its case is not run"
fi
# SIGTERM during a long validation: it stops at the next batch, is not recorded, and the run
# ends with its checkpoint as after any SIGTERM (a validation of minutes used to run to its end).
make_tokens "$SCRATCH/long_val.bin" 2000000 3  # ≈ 25 s of validation for this model on one thread
"$TRAIN" --config "$SCRATCH/tiny.json" --set data.val="$SCRATCH/long_val.bin" --set train.eval_every=10 \
  --set train.eval_batches=1000000 --set model.n_embd=64 --set model.n_layer=2 --out "$SCRATCH/longval" >"$SCRATCH/longval.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q "step 0 | validating on" "$SCRATCH/longval.log" && break; sleep 0.1; done
sleep 0.5
kill -TERM "$pid"
started=$(date +%s)
set +e; wait "$pid"; code=$?; set -e
[ "$code" -eq 143 ] || { cat "$SCRATCH/longval.log" >&2; fail "SIGTERM during validation: exit $code, expected 143"; }
[ $(( $(date +%s) - started )) -le 5 ] || fail "SIGTERM during validation took more than 5 s to stop the run"
grep -q "validation stopped by signal 15; not recorded" "$SCRATCH/longval.log" ||
  { cat "$SCRATCH/longval.log" >&2; fail "no message for the stopped validation"; }
! grep -q '"event":"eval"' "$SCRATCH/longval/metrics.jsonl" || fail "the stopped validation was recorded"
ls "$SCRATCH/longval/checkpoints" | grep -q '^step_' || fail "no checkpoint after SIGTERM during validation"

# kill -9 at several moments of a run that checkpoints (and prunes) every step: every step
# directory left holds all three files, and --resume auto continues from the newest.
KILL_RUN=(--config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=1
          --set train.keep_checkpoints=1 --out "$SCRATCH/kill" --resume auto -q)
saves() { cat "$SCRATCH/kill/train.log" 2>/dev/null | grep -c '] info checkpoint ' || true; }
for delay in 0.05 0.15 0.25 0.35 0.45; do
  before=$(saves)
  "$TRAIN" "${KILL_RUN[@]}" >"$SCRATCH/kill.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do [ "$(saves)" -gt "$before" ] && break; sleep 0.1; done
  sleep "$delay"
  kill -KILL "$pid"
  set +e; wait "$pid"; set -e
  for dir in "$SCRATCH"/kill/checkpoints/step_????????; do
    for f in model.safetensors optimizer.safetensors trainer.json; do
      [ -f "$dir/$f" ] || fail "after kill -9 (delay $delay) $dir looks like a checkpoint but lacks $f"
    done
  done
done
latest=$(ls -d "$SCRATCH"/kill/checkpoints/step_???????? | tail -1)
expect_exit 0 "$TRAIN" "${KILL_RUN[@]}" --stop-at $((10#${latest##*step_} + 2))
grep -q "resumed from .*${latest##*/}" "$SCRATCH/kill/train.log" || fail "the killed run did not resume from ${latest##*/}"
echo "PASS"
