#!/usr/bin/env bash
# pope-train end to end: help, config and data errors with exit codes, a small run whose
# validation loss falls, the progress lines, --dry-run's start-up checks, relative data paths,
# SIGTERM → checkpoint → resume, a changed model key on resume, refusing to overwrite a run, a
# run without checkpoints, corrupt checkpoints, and the paper configs' parameter counts.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }

make_tokens "$SCRATCH/train.bin" 60000 1
make_tokens "$SCRATCH/val.bin" 8000 2
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 32, "position": {"kind": "pope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "train": {"steps": 60, "batch_size": 16, "micro_batch_size": 8, "seq_len": 32, "log_every": 10,
            "eval_every": 20, "eval_batches": 4, "checkpoint_every": 20, "threads": 1, "device": "cpu"}
}
JSON

# --help documents the options.
expect_exit 0 "$TRAIN" --help
for opt in --config --set --out --resume --device --stop-at --no-checkpoints --dry-run; do expect_output -- "$opt"; done

# Config errors: exit 2, naming the key and what was expected.
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.bogus=1
expect_output "model.bogus"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.n_head=two
expect_output "model.n_head"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=sinusoid
expect_output "model.position.kind"
expect_exit 2 "$TRAIN" --config "$SCRATCH/missing.json"
expect_output "missing.json"

# Data errors: exit 1, naming the file.
printf 'abc' >"$SCRATCH/odd.bin"
expect_exit 1 "$TRAIN" --config "$SCRATCH/tiny.json" --set data.train="$SCRATCH/odd.bin" --out "$SCRATCH/bad"
expect_output "odd.bin"

# A run directory that cannot be made (a file in its place): exit 2, naming --out and the path.
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/odd.bin/run"
expect_output "--out"
expect_output "odd.bin/run"

# --dry-run runs the start-up checks and reports every problem at once (data: exit 1) without
# creating the run directory; a clean one says so and exits 0.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/dry" --dry-run
expect_output "every start-up check passed"
[ ! -e "$SCRATCH/dry" ] || fail "--dry-run created the run directory"
make_tokens "$SCRATCH/short_val.bin" 20 3
mkdir -p "$SCRATCH/dry_bad" && : >"$SCRATCH/dry_bad/checkpoints"
expect_exit 1 "$TRAIN" --config "$SCRATCH/tiny.json" --set data.train="$SCRATCH/absent.bin" \
  --set data.val="$SCRATCH/short_val.bin" --out "$SCRATCH/dry_bad" --dry-run
expect_output "data.train: .*absent.bin"
expect_output "short_val.bin holds no window of train.seq_len + 1 = 33 tokens"
expect_output "checkpoints\" exists and is not a directory"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.sample_every=10 --set train.sample_prompt=zz \
  --out "$SCRATCH/dry" --dry-run
expect_output "train.sample_prompt"

# Relative data paths are read from the working directory: a run started elsewhere is told which.
(cd "$SCRATCH" && expect_exit 0 "$TRAIN" --config tiny.json --set data.train=train.bin --out dry --dry-run)
mkdir -p "$SCRATCH/elsewhere"
(cd "$SCRATCH/elsewhere" && expect_exit 1 "$TRAIN" --config ../tiny.json --set data.train=train.bin --out dry --dry-run)
expect_output "a relative data path is read from the working directory, $SCRATCH/elsewhere"

# A real run: validation loss falls; the run directory holds config, metrics, log, checkpoints.
# Log lines carry the elapsed time; the ETA waits for a timed window; each validation announces itself.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/run"
expect_output "val loss"
expect_output "\] info step  1/60 .* | ETA (estimating)"
expect_output "\] info step 20/60 .* | ETA [0-9]"
expect_output ":[0-9][0-9] +[0-9]*s\] info step 0 | validating on 32 windows"
for f in config.json metrics.jsonl train.log checkpoints/step_00000060/model.safetensors; do
  [ -e "$SCRATCH/run/$f" ] || fail "run directory lacks $f"
done
python3 - "$SCRATCH/run/metrics.jsonl" <<'PY' || fail "validation loss did not fall"
import json, sys
evals = [r["val_loss"] for r in map(json.loads, open(sys.argv[1])) if r["event"] == "eval"]
print("val losses:", evals)
sys.exit(0 if len(evals) >= 3 and evals[-1] < evals[0] - 0.5 else 1)
PY

# Starting again in the same directory without --resume is refused.
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/run"
expect_output "--resume auto"

# SIGTERM: the step finishes, a checkpoint is written, exit code 143; --resume auto completes.
"$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=0 \
  --out "$SCRATCH/term" -q >"$SCRATCH/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ "$(grep -c '"event":"train"' "$SCRATCH/term/metrics.jsonl" 2>/dev/null || true)" -ge 2 ] && break
  sleep 0.1
done
kill -TERM "$pid"
set +e; wait "$pid"; code=$?; set -e
[ "$code" -eq 143 ] || { cat "$SCRATCH/term.log" >&2; fail "SIGTERM exit code $code, expected 143"; }
ls "$SCRATCH/term/checkpoints" | grep -q '^step_' || fail "no checkpoint after SIGTERM"
stopped_at=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" \
  "$(ls -d "$SCRATCH"/term/checkpoints/step_* | tail -1)/trainer.json")
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=0 \
  --out "$SCRATCH/term" --resume auto --stop-at $((stopped_at + 3))
expect_output "resumed from"

# Another model.position.kind on resume is named as the config key, before any tensor is read (exit 2).
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=0 \
  --set model.position.kind=rope --out "$SCRATCH/term" --resume auto
expect_output 'model.position.kind = "pope", this config says "rope"'
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=100000 --set train.checkpoint_every=0 \
  --set model.position.kind=rope --out "$SCRATCH/term" --resume auto --dry-run
expect_output 'model.position.kind = "pope", this config says "rope"'

# --no-checkpoints: the run trains and writes no checkpoint at all (not even the last);
# with --stop-at (which checkpoints) it is a usage error.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.steps=25 --out "$SCRATCH/bench" --no-checkpoints
expect_output "checkpoint none written"
[ ! -d "$SCRATCH/bench/checkpoints" ] || [ -z "$(ls "$SCRATCH/bench/checkpoints")" ] || fail "--no-checkpoints wrote one"
grep -q '"step":25' "$SCRATCH/bench/metrics.jsonl" || fail "--no-checkpoints run did not reach step 25"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/bench2" --no-checkpoints --stop-at 5
expect_output "excludes"

# A corrupt checkpoint is rejected with the file named, exit 1.
latest=$(ls -d "$SCRATCH"/run/checkpoints/step_* | tail -1)
truncate -s 100 "$latest/model.safetensors"
expect_exit 1 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/run" --resume auto
expect_output "model.safetensors"

# The paper's configs load and report their parameter counts (on this test's tokens: --dry-run checks the data).
for pair in owt_124m:123.5M owt_253m:252.8M owt_774m:772.1M; do
  expect_exit 0 "$TRAIN" --config "${pair%%:*}" --set data.train="$SCRATCH/train.bin" --set data.val="$SCRATCH/val.bin" \
    --out "$SCRATCH/paper" --dry-run
  expect_output "${pair#*:} in weight matrices"
done
echo "PASS"
