#!/usr/bin/env bash
# pope-eval's refusals of bad flag values, each exit 2 naming the flag: --lengths ranges of
# more lengths than the bound (they used to be expanded without end), malformed --lengths,
# --threads past its bound (100000 crashed), negative --max-windows (it wrapped to "all
# windows"), RoPE scaling parameters without the --rope-scaling kind that reads them (they were
# ignored) and bad scaling values (they were blamed on the run's config.json); the default
# --lengths (the training length), a non-finite perplexity (exit 1, no table) and --diagnostics'
# refusals (data too short for a window, the sweep's --csv and --plot).
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
EVAL="$POPE_BIN/pope-eval"
[ -x "$TRAIN" ] && [ -x "$EVAL" ] || { echo "SKIP: pope-train or pope-eval not built"; exit 77; }

make_tokens "$SCRATCH/train.bin" 4000 1
make_tokens "$SCRATCH/val.bin" 2000 2
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 1, "n_head": 2, "n_embd": 16,
            "context_length": 16, "position": {"kind": "rope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "train": {"steps": 2, "batch_size": 4, "micro_batch_size": 4, "seq_len": 16, "log_every": 1,
            "eval_every": 0, "eval_batches": 1, "checkpoint_every": 2, "threads": 1, "device": "cpu"}
}
JSON
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/run" -q
ARGS=(--checkpoint "$SCRATCH/run" --data "$SCRATCH/val.bin" --device cpu -q)

# A range is counted before it is expanded. Under a 2 GB address-space limit and a timeout, the
# old expansion of 2^31 lengths ends in an out-of-memory exit 1 (or 124), not the refusal.
expect_exit 2 bash -c 'ulimit -v 2000000; exec timeout 60 "$@"' _ "$EVAL" "${ARGS[@]}" --lengths 16:2147483647:1
expect_output "--lengths: '16:2147483647:1' gives 2147483632 lengths; at most 1024 are allowed"
expect_exit 2 timeout 60 "$EVAL" "${ARGS[@]}" --lengths 1:1000000:1
expect_output "gives 1000000 lengths; at most 1024"
expect_exit 2 timeout 60 "$EVAL" "${ARGS[@]}" --lengths 1:1025:1
expect_output "gives 1025 lengths"
for bad in "1024:" "0:10:1" "10:1:1" "a:b:c" "1,,2"; do
  expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths "$bad"
  expect_output "--lengths: '"
done
# The bound itself is allowed: 1,024 lengths, all but 16 longer than the data (skipped, fast).
expect_exit 0 "$EVAL" "${ARGS[@]}" --lengths "16,$(seq -s, 2001 3023)" --max-windows 1 --threads 1
expect_output "    3023        0"

expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --threads 100000
expect_output "--threads: expected an integer from 0 to 1024, got 100000"
expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --threads -1
expect_output "--threads: expected an integer from 0 to 1024, got -1"
expect_exit 0 "$EVAL" "${ARGS[@]}" --lengths 16 --threads 1024 --max-windows 1

expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --max-windows -5
expect_output "--max-windows: expected an integer from 0 to 18446744073709551615, got -5"

# Scaling parameters need the --rope-scaling kind that reads them.
expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-factor 4
expect_output "--rope-factor: needs --rope-scaling pi, ntk or yarn"
for flag in --yarn-alpha --yarn-beta --yarn-temperature; do
  expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 "$flag" 2
  expect_output "$flag: needs --rope-scaling yarn"
  expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-scaling pi "$flag" 2
  expect_output "$flag: is not used by --rope-scaling pi"
done
expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-scaling dynamic-ntk --rope-factor 2
expect_output "--rope-factor: is not used by --rope-scaling dynamic-ntk"

# Bad values name the flag, not the run's config.json.
check_value() {  # FLAG VALUE EXPECTED
  expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-scaling yarn "$1" "$2"
  expect_output "$1: $3, got $2"
  if grep -q "config.json" "$SCRATCH/out"; then cat "$SCRATCH/out" >&2; fail "$1 $2 is blamed on config.json"; fi
}
for value in nan -4 inf 0.5; do check_value --rope-factor "$value" "expected a number >= 1"; done
for value in nan -4; do
  check_value --yarn-alpha "$value" "expected a number >= 0"
  check_value --yarn-beta "$value" "expected a number > 0"
  check_value --yarn-temperature "$value" "expected a number >= 0"
done
check_value --yarn-beta 0 "expected a number > 0"
expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-scaling yarn --yarn-alpha 4 --yarn-beta 3
expect_output "--rope-scaling: model.position.rope.scaling.yarn_beta"
# Against the checkpoint's yarn_beta (32) the config refuses it too, and the message names the flags.
expect_exit 2 "$EVAL" "${ARGS[@]}" --lengths 16 --rope-scaling yarn --yarn-alpha 40
expect_output "--rope-scaling: model.position.rope.scaling.yarn_beta"
expect_output "--yarn-\* override these keys"

# Every scaling flag with the kind that reads it is taken.
expect_exit 0 "$EVAL" "${ARGS[@]}" --threads 1 --lengths 16,32 --max-windows 2 --rope-scaling yarn --rope-factor 4 \
  --yarn-alpha 2 --yarn-beta 16 --yarn-temperature 1 --json "$SCRATCH/yarn.json"
python3 - "$SCRATCH/yarn.json" <<'PY' || fail "the yarn flags did not reach the report"
import json, sys
curve = json.load(open(sys.argv[1]))["curves"][0]
assert curve["position"].startswith("rope+yarn(s=4 a=2 b=16"), curve["position"]
PY

# Without --lengths the sweep evaluates the training length (train.seq_len 16).
expect_exit 0 "$EVAL" "${ARGS[@]}" --threads 1
expect_output "lengths 16 (the training length)"
grep -Eq '^ +16 +124 +1984 ' "$SCRATCH/out" || { cat "$SCRATCH/out" >&2; fail "no row for the training length 16"; }

# A finite but huge weight overflows the forward: an error with exit 1, not a table of -nan.
cp -r "$SCRATCH/run" "$SCRATCH/huge"
python3 - "$SCRATCH/huge" <<'PY' || fail "could not enlarge the checkpoint copy's weight"
import glob, json, struct, sys
path = sorted(glob.glob(sys.argv[1] + "/checkpoints/step_*/model.safetensors"))[-1]
data = bytearray(open(path, "rb").read())
header = struct.unpack("<Q", data[:8])[0]
begin, end = json.loads(data[8:8 + header])["final_norm.weight"]["data_offsets"]
data[8 + header + begin:8 + header + end] = struct.pack("<f", 3e38) * ((end - begin) // 4)
open(path, "wb").write(data)
PY
expect_exit 1 "$EVAL" --checkpoint "$SCRATCH/huge" --data "$SCRATCH/val.bin" --device cpu --lengths 16 \
  --csv "$SCRATCH/huge.csv"
expect_output "huge/checkpoints/step_00000002: the mean NLL at length 16 is -\?nan (perplexity -\?nan), not a finite number"
[ ! -e "$SCRATCH/huge.csv" ] || fail "a CSV was written for a non-finite perplexity"

# --diagnostics (a PJ-RoPE checkpoint): data too short for one window is refused, not a NaN ΔNLL;
# the length sweep's --csv and --plot are refused, not ignored.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=full --out "$SCRATCH/pj" -q
make_tokens "$SCRATCH/short.bin" 10 3
expect_exit 2 "$EVAL" --diagnostics --checkpoint "$SCRATCH/pj" --data "$SCRATCH/short.bin" --device cpu
expect_output "--lengths: no length in '16 (the training length)' fits a window of .*short.bin"
for flag in --csv --plot; do
  expect_exit 2 "$EVAL" --diagnostics --checkpoint "$SCRATCH/pj" --device cpu "$flag" "$SCRATCH/diag.out"
  expect_output "$flag: is not read by --diagnostics"
done
expect_exit 0 "$EVAL" --diagnostics --checkpoint "$SCRATCH/pj" --data "$SCRATCH/val.bin" --device cpu
expect_output "leave-sector-out affine"
if grep -q nan "$SCRATCH/out"; then cat "$SCRATCH/out" >&2; fail "the diagnostics hold a NaN"; fi
echo "PASS"
