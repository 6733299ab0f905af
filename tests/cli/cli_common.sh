# Helpers sourced by the CLI tests: binaries from the build tree, a scratch directory,
# assertions that print what went wrong.
set -euo pipefail

POPE_BIN="${POPE_BIN:?POPE_BIN must point at the src directory of the build}"
POPE_SOURCE_DIR="${POPE_SOURCE_DIR:?POPE_SOURCE_DIR must point at the source tree}"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/pope_cli.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_exit CODE CMD…: runs CMD, captures stdout+stderr in $SCRATCH/out, checks the exit code.
expect_exit() {
  local want=$1; shift
  set +e
  "$@" >"$SCRATCH/out" 2>&1
  local got=$?
  set -e
  [ "$got" -eq "$want" ] || { cat "$SCRATCH/out" >&2; fail "'$*' exited $got, expected $want"; }
}

expect_output() {
  grep -q -- "$1" "$SCRATCH/out" || { cat "$SCRATCH/out" >&2; fail "output lacks '$1'"; }
}

# A learnable synthetic token stream (nanoGPT uint16 format): t → (5t + 3) mod V with 10% noise.
# write_tiny_config FILE 'TRAIN_KEYS': a one-layer CPU model on random tokens ($SCRATCH/train.bin
# and val.bin, made on first use); TRAIN_KEYS are the train section's other "key": value pairs.
write_tiny_config() {
  [ -f "$SCRATCH/train.bin" ] || make_tokens "$SCRATCH/train.bin" 20000 1
  [ -f "$SCRATCH/val.bin" ] || make_tokens "$SCRATCH/val.bin" 4000 2
  cat >"$1" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 1, "n_head": 2, "n_embd": 16,
            "context_length": 16, "position": {"kind": "rope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "train": {"batch_size": 4, "micro_batch_size": 4, "seq_len": 16, "log_every": 1, "eval_batches": 1,
            "threads": 1, "device": "cpu", $2}
}
JSON
}

make_tokens() {  # FILE COUNT SEED
  python3 - "$1" "$2" "$3" <<'PY'
import array, random, sys
path, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
t, out = 1, array.array("H")
for _ in range(count):
    t = rng.randrange(64) if rng.random() < 0.1 else (5 * t + 3) % 64
    out.append(t)
with open(path, "wb") as f:
    out.tofile(f)
PY
}

# Skips the test (exit 77) unless the tokenizer files are fetched and this build can tokenize
# (a build without PCRE2 cannot); exports POPE_TOKENIZER_DIR for the tools.
require_tokenizer() {
  [ -f "$POPE_SOURCE_DIR/data/tokenizer/encoder.json" ] ||
    { echo "SKIP: tokenizer files missing: run scripts/fetch_tokenizer.sh"; exit 77; }
  export POPE_TOKENIZER_DIR="$POPE_SOURCE_DIR/data/tokenizer"
  "$POPE_BIN/pope-data" encode x >/dev/null 2>&1 ||
    { echo "SKIP: this build cannot tokenize: $("$POPE_BIN/pope-data" encode x 2>&1 | tail -1)"; exit 77; }
}
