#!/usr/bin/env bash
# pope-export end to end on the CPU: --help, usage/config/checkpoint errors with their exit codes, the
# destination rules (absent or empty, never a non-empty one), atomicity (a write that fails half-way, a
# process killed half-way: no --out folder, no staging directory once the next export ran), and for every
# encoding of `pope-bench encodings` plus options (RoPE scalings, fraction, PoPE ablations and δ's bound,
# ALiBi head fraction, PJ orders and ρ, PJ-rotary orders, T5 buckets, xPos decay, a --set at export) a tiny model
# trained here, its weights perturbed (tests/cli/export_check.py jitter), evaluated by pope-eval at
# 8, 16 (the training length) and 40 tokens, exported, loaded with PyTorch (modeling_pope.PopeGPT; also
# transformers' AutoModelForCausalLM where transformers imports) and its mean and tail NLL held to
# pope-eval's: f32 within 1e-5 relative, bf16 within 1e-2. Two tampered exports must fail that check,
# and a GPT-2-vocabulary model carries the tokenizer files. Without a python with torch
# (POPE_TORCH_PYTHON, python3, /usr/bin/python3) the PyTorch part is skipped: exit 77 (SKIP).
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
EVAL="$POPE_BIN/pope-eval"
EXPORT="$POPE_BIN/pope-export"
BENCH="$POPE_BIN/pope-bench"
CHECK="$POPE_SOURCE_DIR/tests/cli/export_check.py"
for tool in "$TRAIN" "$EVAL" "$EXPORT" "$BENCH"; do [ -x "$tool" ] || { echo "SKIP: $tool not built"; exit 77; }; done
F32_TOLERANCE=1e-5
BF16_TOLERANCE=1e-2

# Ids below 61 (vocabulary 61 padded to 64: the padded logits must be left out).
make_ids() {  # FILE COUNT SEED
  python3 - "$1" "$2" "$3" <<'PY'
import array, random, sys
path, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, out = 1, array.array("H")
for _ in range(count):
    t = rng.randrange(61) if rng.random() < 0.2 else (5 * t + 3) % 61
    out.append(t)
open(path, "wb").write(out.tobytes())
PY
}
make_ids "$SCRATCH/train.bin" 20000 1
make_ids "$SCRATCH/book.bin" 600 2
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 61, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 16, "position": {"kind": "pope"}},
  "data": {"train": "$SCRATCH/train.bin"},
  "optim": {"lr": 3e-3, "warmup_steps": 0},
  "train": {"steps": 2, "batch_size": 4, "micro_batch_size": 4, "seq_len": 16, "log_every": 1,
            "threads": 1, "device": "cpu"}
}
JSON
mkdir "$SCRATCH/runs" "$SCRATCH/exports" "$SCRATCH/evals" "$SCRATCH/case_runs" "$SCRATCH/cases"
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/runs/base" -q
RUN="$SCRATCH/runs/base"

# --help names every option and the exit codes.
expect_exit 0 "$EXPORT" --help
for opt in --checkpoint --out --format --dtype --set --tokenizer --no-tokenizer "Exit codes" "trust_remote_code"; do
  expect_output -- "$opt"
done

# Usage and config errors: exit 2, naming the flag or key.
expect_exit 2 "$EXPORT" --out "$SCRATCH/exports/x"
expect_output "--checkpoint"
expect_exit 2 "$EXPORT" --checkpoint "$RUN"
expect_output "--out"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --format onnx
expect_output "--format"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --dtype f16
expect_output "--dtype"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --tokenizer "$SCRATCH" --no-tokenizer
expect_output "--no-tokenizer"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --set train.seq_len=8
expect_output "model.\* keys"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --set model.bogus=1
expect_output "model.bogus"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --tokenizer "$SCRATCH"
expect_output "--tokenizer: the model has a vocabulary of 61 tokens"
[ ! -e "$SCRATCH/exports/x" ] || fail "a refused export left $SCRATCH/exports/x"

# The destination: refused (exit 2, nothing touched) unless absent or an empty directory.
mkdir "$SCRATCH/exports/occupied"
echo "keep me" >"$SCRATCH/exports/occupied/notes.txt"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/occupied"
expect_output "--out: .*exports/occupied\" is not empty"
[ "$(ls -A "$SCRATCH/exports/occupied")" = "notes.txt" ] && grep -q "keep me" "$SCRATCH/exports/occupied/notes.txt" \
  || fail "a refused export touched the non-empty --out"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/occupied/notes.txt"
expect_output "exists and is not a directory"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/no/such/dir/x"
expect_output "does not exist"
ln -s "$SCRATCH/exports/occupied" "$SCRATCH/exports/link"
expect_exit 2 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/link"
expect_output "symbolic link"
mkdir "$SCRATCH/exports/into_empty"
expect_exit 0 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/into_empty"
expect_output "wrote $SCRATCH/exports/into_empty"
for file in model.safetensors config.json modeling_pope.py README.md; do
  [ -f "$SCRATCH/exports/into_empty/$file" ] || fail "the export lacks $file"
done
cmp -s "$SCRATCH/exports/into_empty/modeling_pope.py" "$POPE_SOURCE_DIR/python/pope_hf/modeling_pope.py" \
  || fail "the exported modeling_pope.py is not python/pope_hf/modeling_pope.py (rebuild pope-export)"
grep -q "trust_remote_code=True" "$SCRATCH/exports/into_empty/README.md" || fail "the folder's README does not say how to load it"

# Checkpoint errors: exit 1, naming the path or the tensor.
expect_exit 1 "$EXPORT" --checkpoint "$SCRATCH/runs/missing" --out "$SCRATCH/exports/x"
expect_output "runs/missing"
expect_exit 1 "$EXPORT" --checkpoint "$SCRATCH/evals" --out "$SCRATCH/exports/x"
expect_output "neither a run directory"
cp -r "$RUN" "$SCRATCH/runs/mismatch"
sed -i 's/"kind": "pope"/"kind": "rope"/' "$SCRATCH/runs/mismatch/config.json"
expect_exit 1 "$EXPORT" --checkpoint "$SCRATCH/runs/mismatch" --out "$SCRATCH/exports/x"
expect_output "layers.0.position.delta"
expect_exit 1 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/x" --set model.n_embd=64
expect_output "wte.weight"
[ ! -e "$SCRATCH/exports/x" ] || fail "a failed export left $SCRATCH/exports/x"

# Atomicity. A write that fails half-way (files limited to 20 KiB, SIGXFSZ ignored, so write()
# fails with EFBIG): exit 1, no folder, no staging directory left.
set +e
(ulimit -c 0; ulimit -f 20; trap '' XFSZ; exec "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/partial") >"$SCRATCH/out" 2>&1
code=$?
set -e
[ "$code" = 1 ] || { cat "$SCRATCH/out"; fail "an export that could not write exited $code, expected 1"; }
expect_output "File too large"
[ ! -e "$SCRATCH/exports/partial" ] || fail "a failed export left a half-written folder"
[ -z "$(ls -A "$SCRATCH/exports" | grep pope-export || true)" ] || fail "a failed export left its staging directory"
# A process killed half-way (SIGXFSZ's default action): no folder; its hidden staging directory
# stays until the next export to that folder, which removes it (its process is gone).
set +e
(ulimit -c 0; ulimit -f 20; exec "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/killed") >"$SCRATCH/out" 2>&1
code=$?
set -e
[ "$code" -gt 128 ] || { cat "$SCRATCH/out"; fail "an export over the file size limit exited $code, expected death by SIGXFSZ"; }
[ ! -e "$SCRATCH/exports/killed" ] || fail "a killed export left a half-written folder"
ls -A "$SCRATCH/exports" | grep -q '^\.killed\.pope-export-' || fail "expected the killed export's staging directory"
expect_exit 0 "$EXPORT" --checkpoint "$RUN" --out "$SCRATCH/exports/killed"
expect_output "left by an export that was stopped"
[ -z "$(ls -A "$SCRATCH/exports" | grep pope-export || true)" ] || fail "the stale staging directory was not removed"

torch_python=""
for candidate in "${POPE_TORCH_PYTHON:-}" python3 /usr/bin/python3; do
  if [ -n "$candidate" ] && "$candidate" -c 'import torch' >/dev/null 2>&1; then torch_python="$candidate"; break; fi
done
if [ -z "$torch_python" ]; then
  echo "SKIP: no python with torch (POPE_TORCH_PYTHON, python3, /usr/bin/python3): the exports were not loaded"
  exit 77
fi

# Every encoding at its defaults (4 heads: ALiBi's and PJ's per-head values differ), then options.
# A case: NAME|training --set flags|--set flags of pope-eval and pope-export (the same).
expect_exit 0 "$BENCH" encodings
kinds=$(cut -f1 "$SCRATCH/out")
[ "$(wc -w <<<"$kinds")" -ge 18 ] || fail "pope-bench encodings lists only: $kinds"
cases=()
for kind in $kinds; do cases+=("$kind|--set model.position.kind=$kind --set model.n_head=4|"); done
cases+=(
  "none_alias|--set model.position.kind=none|"
  "pjrope_alias|--set model.position.kind=pjrope --set model.position.pj.gate_init=uniform|"
  "rope_fraction_half|--set model.position.kind=rope --set model.position.rope.fraction=0.5|"
  "rope_pi_4|--set model.position.kind=rope_pi --set model.position.rope.scaling.factor=4|"
  "rope_ntk_4_half|--set model.position.kind=rope_ntk --set model.position.rope.scaling.factor=4 --set model.position.rope.fraction=0.5|"
  "rope_yarn_4_temperature|--set model.position.kind=rope_yarn --set model.position.rope.scaling.factor=4 --set model.position.rope.scaling.yarn_temperature=1.2|"
  "rope_dynamic_ntk|--set model.position.kind=rope --set model.position.rope.scaling.kind=dynamic_ntk|"
  "rope_export_set_yarn|--set model.position.kind=rope|--set model.position.rope.scaling.kind=yarn --set model.position.rope.scaling.factor=2"
  "rope_yarn_affine_lightcone|--set model.position.kind=rope_yarn_affine --set model.position.rope.scaling.factor=2 --set model.position.pj.rho=lightcone|"
  "pope_identity_2d|--set model.position.pope.magnitude=identity --set model.position.pope.scale=inv_sqrt_2d|"
  "pope_relu_no_delta|--set model.position.pope.magnitude=relu --set model.position.pope.learn_delta=false|"
  "pope_uniform_delta|--set model.position.pope.delta_init=uniform --set model.position.pope.base=500|"
  "pope_delta_unbounded|--set model.position.pope.delta_bound=none|"
  "pope_delta_projected|--set model.position.pope.delta_bound=project|"
  "alibi_half_of_4|--set model.position.kind=alibi --set model.n_head=4 --set model.position.alibi.head_fraction=0.5|"
  "alibi_6_heads|--set model.position.kind=alibi --set model.n_embd=48 --set model.n_head=6|"
  "full_k1_lightcone|--set model.position.kind=full --set model.position.pj.order=1 --set model.position.pj.rho=lightcone|"
  "fj_lc_k0|--set model.position.kind=fj_lc --set model.position.pj.order=0|"
  "pj_rotary_k0|--set model.position.kind=pj_rotary --set model.position.pj.rotary_order=0|"
  "pj_rotary_k3|--set model.position.kind=pj_rotary --set model.position.pj.rotary_order=3 --set model.position.pj.rotary_eta=0.5 --set model.position.pj.rotary_base=100|"
  "t5_bias_9_buckets|--set model.position.kind=t5_bias --set model.position.t5_bias.buckets=9 --set model.position.t5_bias.max_distance=12|"
  "xpos_fast_decay|--set model.position.kind=xpos --set model.position.xpos.scale_base=16|"
)
BF16_CASES=" pope rope_yarn_4_temperature full t5_bias pj_rotary xpos "
manifest="$SCRATCH/cases.json"
echo "[" >"$manifest"
separator=""
add_case() {  # NAME DIR EVAL_JSON TOLERANCE DTYPE EXPECT_MISMATCH
  printf '%s{"name": "%s", "dir": "%s", "eval_json": "%s", "book": "%s", "tolerance": %s, "dtype": "%s", "expect_mismatch": %s}\n' \
    "$separator" "$1" "$2" "$3" "$SCRATCH/book.bin" "$4" "$5" "$6" >>"$manifest"
  separator=","
}
seed=1
for case in "${cases[@]}"; do
  IFS='|' read -r name train_sets eval_sets <<<"$case"
  read -r -a train_args <<<"$train_sets"
  read -r -a eval_args <<<"$eval_sets"
  run="$SCRATCH/case_runs/$name"
  expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$run" -q "${train_args[@]}"
  "$torch_python" "$CHECK" jitter "$run/checkpoints/step_00000002/model.safetensors" "$seed" || fail "jitter $name"
  seed=$((seed + 1))
  expect_exit 0 "$EVAL" --checkpoint "$run" --data "$SCRATCH/book.bin" --lengths 8,16,40 --tail 3 --device cpu \
    --threads 1 --json "$SCRATCH/evals/$name.json" -q "${eval_args[@]}"
  expect_exit 0 "$EXPORT" --checkpoint "$run" --out "$SCRATCH/cases/$name" "${eval_args[@]}"
  add_case "$name" "$SCRATCH/cases/$name" "$SCRATCH/evals/$name.json" "$F32_TOLERANCE" f32 false
  if [[ "$BF16_CASES" == *" $name "* ]]; then
    expect_exit 0 "$EXPORT" --checkpoint "$run" --out "$SCRATCH/cases/${name}_bf16" --dtype bf16 "${eval_args[@]}"
    add_case "${name}_bf16" "$SCRATCH/cases/${name}_bf16" "$SCRATCH/evals/$name.json" "$BF16_TOLERANCE" bf16 false
  fi
done

# Controls: a changed RoPE base, T5 lag buckets and δ's bound (the jitter puts about half of δ above
# 0) must fail the comparison (the check sees them).
tamper() {  # CASE KEY VALUE
  cp -r "$SCRATCH/cases/$1" "$SCRATCH/cases/$1_tampered"
  "$torch_python" - "$SCRATCH/cases/$1_tampered/config.json" "$2" "$3" <<'PY'
import json, sys
path, key, value = sys.argv[1], sys.argv[2].split("."), json.loads(sys.argv[3])
config = json.load(open(path))
node = config["pope_config"]["model"]["position"]
for part in key[:-1]:
    node = node[part]
node[key[-1]] = value
json.dump(config, open(path, "w"), indent=2)
PY
  add_case "$1_tampered" "$SCRATCH/cases/$1_tampered" "$SCRATCH/evals/$1.json" "$F32_TOLERANCE" f32 true
}
tamper rope rope.base 5000.0
tamper t5_bias t5_bias.max_distance 64
tamper pope_delta_unbounded pope.delta_bound '"clamp"'

# A model with GPT-2's vocabulary carries the tokenizer (when its files are here: scripts/fetch_data.sh).
tokenizer="$POPE_SOURCE_DIR/data/tokenizer"
if [ -f "$tokenizer/encoder.json" ] && [ -f "$tokenizer/vocab.bpe" ]; then
  gpt2_sets=(--set model.vocab_size=50257 --set model.padded_vocab_size=50304 --set model.n_layer=1
             --set model.position.kind=rope)
  expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/runs/gpt2" -q "${gpt2_sets[@]}"
  "$torch_python" "$CHECK" jitter "$SCRATCH/runs/gpt2/checkpoints/step_00000002/model.safetensors" 99
  # Without tokenizer files to be found such a model is refused, naming both ways out: a copy of the
  # binary with no data/tokenizer above it (the build tree's binary finds the checkout's).
  mkdir -p "$SCRATCH/bin" && cp "$EXPORT" "$SCRATCH/bin/"
  lone_export="$SCRATCH/bin/$(basename "$EXPORT")"
  expect_exit 2 env -u POPE_TOKENIZER_DIR bash -c "cd '$SCRATCH' && exec '$lone_export' --checkpoint runs/gpt2 --out exports/gpt2_x"
  expect_output "--tokenizer DIR"
  expect_output "--no-tokenizer"
  expect_exit 0 env -u POPE_TOKENIZER_DIR bash -c "cd '$SCRATCH' && exec '$lone_export' --checkpoint runs/gpt2 --out exports/gpt2_bare --no-tokenizer"
  [ ! -e "$SCRATCH/exports/gpt2_bare/vocab.json" ] || fail "--no-tokenizer wrote vocab.json"
  expect_exit 0 "$EXPORT" --checkpoint "$SCRATCH/runs/gpt2" --out "$SCRATCH/exports/gpt2" --tokenizer "$tokenizer"
  expect_output "tokenizer from $tokenizer"
  cmp -s "$SCRATCH/exports/gpt2/vocab.json" "$tokenizer/encoder.json" || fail "vocab.json is not encoder.json"
  cmp -s "$SCRATCH/exports/gpt2/merges.txt" "$tokenizer/vocab.bpe" || fail "merges.txt is not vocab.bpe"
  expect_exit 0 "$EVAL" --checkpoint "$SCRATCH/runs/gpt2" --data "$SCRATCH/book.bin" --lengths 8,16,40 --tail 3 \
    --device cpu --threads 1 --json "$SCRATCH/evals/gpt2.json" -q
  add_case gpt2_vocabulary "$SCRATCH/exports/gpt2" "$SCRATCH/evals/gpt2.json" "$F32_TOLERANCE" f32 false
else
  echo "SKIP tokenizer part: no $tokenizer/encoder.json (scripts/fetch_data.sh fetches it)"
fi
echo "]" >>"$manifest"

set +e
"$torch_python" "$CHECK" compare "$manifest" >"$SCRATCH/out" 2>&1
code=$?
set -e
cat "$SCRATCH/out"
[ "$code" = 0 ] || fail "the exported models do not match pope (export_check.py exited $code)"
echo "PASS"
