#!/usr/bin/env bash
# pope-eval end to end on tiny models trained here: help, usage/config/data errors with exit
# codes, a length sweep of two checkpoints past 4× the training length with CSV/JSON/PNG,
# reproducing the trainer's logged validation loss, RoPE scaling at evaluation, plotting a
# CSV (pope-eval --plot-csv and scripts/plot_lengths.sh) and pope-train --init-from.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
EVAL="$POPE_BIN/pope-eval"
[ -x "$TRAIN" ] && [ -x "$EVAL" ] || { echo "SKIP: pope-train or pope-eval not built"; exit 77; }

make_tokens "$SCRATCH/train.bin" 60000 1
make_tokens "$SCRATCH/val.bin" 8000 2
mkdir "$SCRATCH/books"
make_tokens "$SCRATCH/books/a.bin" 3000 3
make_tokens "$SCRATCH/books/b.bin" 1500 4
make_tokens "$SCRATCH/books/c.bin" 700 5
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 32, "position": {"kind": "pope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "train": {"steps": 40, "batch_size": 16, "micro_batch_size": 8, "seq_len": 32, "log_every": 10,
            "eval_every": 20, "eval_batches": 4, "checkpoint_every": 20, "threads": 1, "device": "cpu"}
}
JSON
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/pope" -q
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=rope --out "$SCRATCH/rope" -q

# --help documents the options.
expect_exit 0 "$EVAL" --help
for opt in --checkpoint --data --lengths --tail --max-batch-tokens --max-windows --rope-scaling --rope-factor \
  --yarn-alpha --yarn-beta --yarn-temperature --set --device --csv --json --plot --plot-csv; do
  expect_output -- "$opt"
done

# Usage and config errors: exit 2, naming the flag or key.
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 64:32:8
expect_output "--lengths"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 32 --rope-scaling yarn
expect_output "'pope'"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/rope" --data "$SCRATCH/books" --lengths 32 --rope-scaling pi \
  --rope-factor 0.5
expect_output "--rope-factor: expected a number >= 1, got 0.5"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 32 --set train.seq_len=64
expect_output "train.seq_len"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --checkpoint "$SCRATCH/rope" --label one --data "$SCRATCH/books" \
  --lengths 32
expect_output "--label"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --label "a,b" --data "$SCRATCH/books" --lengths 32
expect_output "comma"
expect_exit 2 env PATH=/nonexistent "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 32 \
  --plot "$SCRATCH/x.png"
expect_output "gnuplot"
# Output files that could not be written at the end are refused before the sweep.
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 32 --json "$SCRATCH"
expect_output "--json: \"$SCRATCH\" is a directory"
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 32 --csv "$SCRATCH/no/dir/x.csv"
expect_output "no/dir/x.csv\" does not exist"

# A length longer than every book is reported with 0 windows and a warning; a sweep where no
# length fits (the longest book holds 3000 tokens) is refused before any forward.
expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 1024,4000 --device cpu \
  --threads 1 --json "$SCRATCH/partly.json"
expect_output "length 4000: no book holds a window of 4001 tokens; skipped"
python3 - "$SCRATCH/partly.json" <<'PY' || fail "a length without windows is not reported as such"
import json, sys
rows = {r["length"]: r for r in json.load(open(sys.argv[1]))["curves"][0]["results"]}
assert rows[1024]["windows"] == 3 and rows[4000]["windows"] == 0, rows
assert rows[4000]["perplexity"] is None, rows[4000]
PY
expect_exit 2 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 3000,4000
expect_output "--lengths: no length in '3000,4000' fits a window of $SCRATCH/books"
expect_output "its longest holds 3000"

# Data and checkpoint errors: exit 1, naming the file.
expect_exit 1 "$EVAL" --checkpoint "$SCRATCH/missing_run" --data "$SCRATCH/books" --lengths 32
expect_output "missing_run"
printf 'abc' >"$SCRATCH/odd.bin"
expect_exit 1 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/odd.bin" --lengths 32
expect_output "odd.bin"
# A damaged weight (NaN bytes in model.safetensors) is refused naming the tensor, not evaluated
# to a NaN perplexity.
cp -r "$SCRATCH/pope" "$SCRATCH/damaged"
python3 - "$SCRATCH/damaged" <<'PY' || fail "could not damage the checkpoint copy"
import glob, struct, sys
path = sorted(glob.glob(sys.argv[1] + "/checkpoints/step_*/model.safetensors"))[-1]
data = bytearray(open(path, "rb").read())
header = struct.unpack("<Q", data[:8])[0]
data[8 + header:8 + header + 4] = b"\xff\xff\xff\xff"  # the data's first float becomes a NaN
open(path, "wb").write(data)
PY
expect_exit 1 "$EVAL" --checkpoint "$SCRATCH/damaged" --data "$SCRATCH/books" --lengths 32
expect_output "has 1 non-finite values"

# The sweep: two checkpoints, lengths to 4× the training length, every output.
expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/pope" --checkpoint "$SCRATCH/rope/checkpoints/step_00000040" \
  --data "$SCRATCH/books" --lengths 16:128:16 --tail 16 --max-batch-tokens 256 --device cpu --threads 1 \
  --csv "$SCRATCH/sweep.csv" --json "$SCRATCH/sweep.json"
expect_output "tokens/s"
python3 - "$SCRATCH/sweep.csv" "$SCRATCH/sweep.json" <<'PY' || fail "sweep outputs are wrong"
import csv, json, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 16, len(rows)
assert {r["label"] for r in rows} == {"pope", "rope"}, rows[0]
for r in rows:
    L, windows = int(r["length"]), int(r["windows"])
    # books of 3000, 1500 and 700 tokens: (n - 1) // L windows each
    assert windows == sum((n - 1) // L for n in (3000, 1500, 700)), (L, windows)
    assert int(r["tokens"]) == windows * L
    assert int(r["tail_tokens"]) == windows * min(L, 16)
    assert int(r["batch"]) * L <= max(256, L)
    assert abs(float(r["perplexity"]) - math.exp(float(r["nll"]))) < 1e-6 * float(r["perplexity"])
    assert int(r["train_length"]) == 32
report = json.load(open(sys.argv[2]))
assert report["files"] == 3 and report["data_tokens"] == 5200
assert [c["label"] for c in report["curves"]] == ["pope", "rope"]
assert all(len(c["results"]) == 8 for c in report["curves"])
print("pope ppl by length:", [round(r["perplexity"], 3) for r in report["curves"][0]["results"]])
PY

# Item 5: at L = train.seq_len with the trainer's windows (eval_batches × micro_batch_size spread over
# val.bin), pope-eval reproduces the validation loss the trainer logged at the last step.
expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/val.bin" --lengths 32 --max-windows 32 \
  --json "$SCRATCH/val.json" -q
python3 - "$SCRATCH/pope/metrics.jsonl" "$SCRATCH/val.json" <<'PY' || fail "pope-eval differs from the logged val loss"
import json, sys
logged = [r for r in map(json.loads, open(sys.argv[1])) if r["event"] == "eval"][-1]
nll = json.load(open(sys.argv[2]))["curves"][0]["results"][0]["nll"]
print("trainer val loss", logged["val_loss"], "at step", logged["step"], "| pope-eval", nll)
sys.exit(0 if logged["step"] == 40 and abs(nll - logged["val_loss"]) < 1e-5 else 1)
PY

# RoPE scaling at evaluation: the label says so and the numbers change.
expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/rope" --data "$SCRATCH/books" --lengths 64,128 --rope-scaling yarn \
  --rope-factor 4 --csv "$SCRATCH/yarn.csv" -q
grep -q "rope rope+yarn(s=4 a=1 b=32)" "$SCRATCH/yarn.csv" || { cat "$SCRATCH/yarn.csv"; fail "no yarn label"; }
python3 - "$SCRATCH/sweep.csv" "$SCRATCH/yarn.csv" <<'PY' || fail "yarn did not change the rope perplexity"
import csv, sys
plain = {r["length"]: r["perplexity"] for r in csv.DictReader(open(sys.argv[1])) if r["label"] == "rope"}
yarn = {r["length"]: r["perplexity"] for r in csv.DictReader(open(sys.argv[2]))}
sys.exit(0 if all(plain[L] != yarn[L] for L in ("64", "128")) else 1)
PY
expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/rope" --data "$SCRATCH/books" --lengths 64 --rope-scaling dynamic-ntk -q
expect_output "rope+dynamic_ntk"

# Plotting: in the same call, from a CSV, and with the standalone script.
if command -v gnuplot >/dev/null 2>&1; then
  expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/pope" --data "$SCRATCH/books" --lengths 16:64:16 \
    --plot "$SCRATCH/direct.png" -q
  expect_exit 0 "$EVAL" --plot-csv "$SCRATCH/sweep.csv" --plot "$SCRATCH/from_csv.png"
  expect_exit 0 env POPE_EVAL="$EVAL" bash "$POPE_SOURCE_DIR/scripts/plot_lengths.sh" "$SCRATCH/sweep.csv" \
    "$SCRATCH/script.png" 32
  for png in direct from_csv script; do
    [ "$(head -c 4 "$SCRATCH/$png.png" | tail -c 3)" = "PNG" ] || fail "$png.png is not a PNG"
  done
else
  echo "gnuplot not installed: plots not checked"
fi
expect_exit 2 "$EVAL" --plot-csv "$SCRATCH/sweep.csv"
expect_output "--plot"
mkfifo "$SCRATCH/curves_fifo"
expect_exit 1 timeout 20 "$EVAL" --plot-csv "$SCRATCH/curves_fifo" --plot "$SCRATCH/bad.png"
expect_output "is a FIFO"
expect_exit 1 "$EVAL" --plot-csv "$SCRATCH/val.json" --plot "$SCRATCH/bad.png"
expect_output "val.json line 1"

# pope-train --init-from: a fine-tune at twice the length from the PoPE run's weights.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set train.seq_len=64 --set train.steps=3 \
  --set train.eval_every=0 --init-from "$SCRATCH/pope" --out "$SCRATCH/pope_ft"
expect_output "initialised from"
expect_exit 1 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.n_embd=48 --init-from "$SCRATCH/pope" \
  --out "$SCRATCH/wide"
expect_output "wte.weight"
