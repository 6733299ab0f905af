#!/usr/bin/env bash
# pope-train --seeds / --vary: several runs in one process, each in OUT/seed_S (or
# OUT/<key>_<value>/seed_S), equal bit for bit to the same run trained alone (weights and every
# logged loss); tagged console lines; each resumes from its own directory; SIGTERM checkpoints every
# run; bad --seeds and --vary refused naming the flag.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }
write_tiny_config "$SCRATCH/tiny.json" '"steps": 12, "eval_every": 6, "checkpoint_every": 12'

expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/group" --seeds 3,7
expect_output "seed 7: "
expect_output "seed 3: "
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/solo7" --set train.seed=7 --quiet

last="checkpoints/step_00000012"
cmp -s "$SCRATCH/group/seed_7/$last/model.safetensors" "$SCRATCH/solo7/$last/model.safetensors" ||
  fail "seed 7's weights trained beside seed 3 differ from seed 7 trained alone"
cmp -s "$SCRATCH/group/seed_7/$last/optimizer.safetensors" "$SCRATCH/solo7/$last/optimizer.safetensors" ||
  fail "seed 7's optimizer state trained beside seed 3 differs from seed 7 trained alone"
! cmp -s "$SCRATCH/group/seed_3/$last/model.safetensors" "$SCRATCH/group/seed_7/$last/model.safetensors" ||
  fail "seeds 3 and 7 trained the same weights"
losses() {  # every logged train and validation loss of a run, in order
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], repr(r.get("loss")), repr(r.get("val_loss")))
PY
}
[ "$(losses "$SCRATCH/group/seed_7/metrics.jsonl")" = "$(losses "$SCRATCH/solo7/metrics.jsonl")" ] ||
  fail "seed 7's logged losses differ from its solo run's"
grep -q '"seed": 3' "$SCRATCH/group/seed_3/config.json" || fail "seed_3/config.json does not hold train.seed 3"

# Each run resumes from its own directory.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/group" --seeds 3,7 --resume auto \
  --set train.steps=16 --quiet
for s in 3 7; do [ -d "$SCRATCH/group/seed_$s/checkpoints/step_00000016" ] || fail "seed $s did not resume to step 16"; done

# SIGTERM stops every run: each finishes its step and writes a checkpoint, exit 143.
"$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=0 \
  --out "$SCRATCH/term" --seeds 1,2 -q >"$SCRATCH/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ "$(cat "$SCRATCH"/term/seed_*/metrics.jsonl 2>/dev/null | grep -c '"event":"train"' || true)" -ge 6 ] && break
  sleep 0.1
done
kill -TERM "$pid"
set +e; wait "$pid"; code=$?; set -e
[ "$code" -eq 143 ] || { cat "$SCRATCH/term.log" >&2; fail "SIGTERM exit code $code, expected 143"; }
for s in 1 2; do
  ls "$SCRATCH/term/seed_$s/checkpoints" | grep -q '^step_' || fail "seed $s wrote no checkpoint after SIGTERM"
done

# --vary: one run per value (and per seed), each equal to its solo run.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/vary" --vary model.position.kind=rope,pope \
  --seeds 5 -q
grep -q '"kind": "pope"' "$SCRATCH/vary/kind_pope/seed_5/config.json" || fail "kind_pope/seed_5 is not a PoPE run"
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/solo_pope" --set model.position.kind=pope \
  --set train.seed=5 -q
cmp -s "$SCRATCH/vary/kind_pope/seed_5/$last/model.safetensors" "$SCRATCH/solo_pope/$last/model.safetensors" ||
  fail "the PoPE run of --vary differs from PoPE trained alone"
[ -d "$SCRATCH/vary/kind_rope/seed_5/$last" ] || fail "no RoPE run under --vary"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/vary2" --vary model.position.kind
expect_output "\-\-vary"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/vary3" --vary model.bogus=1,2
expect_output "model.bogus"

# Bad --seeds: exit 2 naming the flag.
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/dup" --seeds 3,3
expect_output "\-\-seeds"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/neg" --seeds 1,-2
expect_output "\-\-seeds"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/group" --seeds 3,7 \
  --resume "$SCRATCH/group/seed_3"
expect_output "\-\-resume"
# --dry-run checks every run.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/dry" --seeds 1,2 --dry-run
expect_output "dry/seed_2"
echo "PASS"
