#!/usr/bin/env bash
# A full disk under every tool that writes: each write that fails must end the tool with a non-zero
# exit and a message naming the file, leave what was complete before (checkpoints resumable, no
# half-written output under the final name), and never exit 0 having lost its results. Without root
# the disk is "filled" per file: `ulimit -f N` makes writes past N KiB fail with EFBIG (SIGXFSZ is
# ignored), and stdout goes to /dev/full (ENOSPC). As root, where mount works, a real small tmpfs
# is filled too. Every case runs; the failures are listed together at the end.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train" DATA="$POPE_BIN/pope-data" EVAL="$POPE_BIN/pope-eval"
SAMPLE="$POPE_BIN/pope-sample" EXPORT="$POPE_BIN/pope-export"
for tool in "$TRAIN" "$DATA" "$EVAL" "$SAMPLE" "$EXPORT"; do
  [ -x "$tool" ] || { echo "SKIP: $tool not built"; exit 77; }
done

# limited KIB CMD…: CMD with every file it writes capped at KIB KiB, as a disk that fills there;
# its output passes through a pipe, so that the file the caller keeps it in is not capped.
limited() {
  local kib=$1; shift
  { ( trap '' XFSZ; ulimit -f "$kib"; exec timeout 120 "$@" ) 2>&1; } | cat
  return "${PIPESTATUS[0]}"
}
# to_full CMD…: CMD with its stdout on /dev/full.
to_full() { timeout 120 "$@" >/dev/full; }
[ -w /dev/full ] || { echo "SKIP: no /dev/full"; exit 77; }
if limited 1 sh -c 'head -c 4096 /dev/zero >"$1"' sh "$SCRATCH/probe" >/dev/null ||
  [ "$(wc -c <"$SCRATCH/probe")" -gt 1024 ]; then
  echo "SKIP: ulimit -f is not enforced here"; exit 77
fi

failures=()
problem() { echo "FAIL: $*" >&2; failures+=("$*"); }
# fails_naming CASE TEXT CMD…: CMD must exit 1 (not 0, not a crash or a timeout) with TEXT in its output.
fails_naming() {
  local name=$1 want=$2 why=""; shift 2
  set +e; "$@" >"$SCRATCH/out" 2>&1; local code=$?; set -e
  if [ "$code" -ne 1 ]; then why="exit $code, expected 1"
  elif ! grep -qF -- "$want" "$SCRATCH/out"; then why="the message lacks '$want'"; fi
  [ -z "$why" ] || { tail -5 "$SCRATCH/out" | sed 's/^/    /' >&2; problem "$name: $why"; }
}
# no_temporaries CASE DIR: an atomic write that failed removed its hidden temporary file.
no_temporaries() {
  local left; left="$(find "$2" -name '.*.??????' 2>/dev/null)"
  [ -z "$left" ] || problem "$1: temporary files left: $left"
}

write_tiny_config "$SCRATCH/tiny.json" '"steps": 60, "eval_every": 0, "checkpoint_every": 2'
# Sizes: config.json ≈ 2 KiB, model.safetensors ≈ 17 KiB, optimizer.safetensors ≈ 34 KiB.
train() { "$TRAIN" --config "$SCRATCH/tiny.json" "$@"; }
expect_exit 0 train --out "$SCRATCH/base" -q --stop-at 4

# --- pope-train ---
# config.json, the first file of a run.
fails_naming "train: config.json" "config.json\": File too large" limited 1 "$TRAIN" --config "$SCRATCH/tiny.json" \
  --out "$SCRATCH/t_config" -q
no_temporaries "train: config.json" "$SCRATCH/t_config"
# metrics.jsonl grows past 4 KiB after ~20 steps (-q: train.log stays small).
fails_naming "train: metrics.jsonl" "metrics.jsonl: File too large" limited 4 "$TRAIN" --config "$SCRATCH/tiny.json" \
  --out "$SCRATCH/t_metrics" -q --no-checkpoints
# train.log: a resumed run whose log already nearly fills its 40 KiB (checkpoints fit below that).
cp -a "$SCRATCH/base" "$SCRATCH/t_log"
python3 -c "import sys; f = open(sys.argv[1], 'a'); f.write('#' * (40 * 1024 - 200 - f.tell()) + '\n')" \
  "$SCRATCH/t_log/train.log"
fails_naming "train: train.log" "train.log: File too large" limited 40 "$TRAIN" --config "$SCRATCH/tiny.json" \
  --out "$SCRATCH/t_log" --resume auto --stop-at 8
# A checkpoint: model.safetensors fits in 20 KiB, optimizer.safetensors does not. The run names the
# file; step 4 stays complete and the run resumes from it once there is room.
cp -a "$SCRATCH/base" "$SCRATCH/t_ckpt"
fails_naming "train: checkpoint" "step_00000006.tmp/optimizer.safetensors\": File too large" \
  limited 20 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/t_ckpt" -q --resume auto --stop-at 8
no_temporaries "train: checkpoint" "$SCRATCH/t_ckpt"
[ ! -e "$SCRATCH/t_ckpt/checkpoints/step_00000006" ] || problem "train: checkpoint: a step 6 appeared"
[ ! -e "$SCRATCH/t_ckpt/checkpoints/step_00000006.tmp" ] || problem "train: checkpoint: the partial step_00000006.tmp was kept"
for f in model.safetensors optimizer.safetensors trainer.json; do
  cmp -s "$SCRATCH/base/checkpoints/step_00000004/$f" "$SCRATCH/t_ckpt/checkpoints/step_00000004/$f" ||
    problem "train: checkpoint: step 4's $f changed"
done
expect_exit 0 train --out "$SCRATCH/t_ckpt" -q --resume auto --stop-at 8
grep -q "resumed from .*step_00000004 at step 4" "$SCRATCH/t_ckpt/train.log" ||
  problem "train: checkpoint: the run did not resume from step 4"
[ -d "$SCRATCH/t_ckpt/checkpoints/step_00000008" ] || problem "train: checkpoint: the resumed run wrote no step 8"

# --- pope-data tokenize: ≈ 300,000 tokens (≈ 600 KB) into 64 KiB: refused, the set marked incomplete ---
export POPE_TOKENIZER_DIR="$POPE_SOURCE_DIR/data/tokenizer"
if [ -f "$POPE_TOKENIZER_DIR/encoder.json" ] && "$DATA" encode x >/dev/null 2>&1; then
  mkdir "$SCRATCH/text"
  head -c 300000 /dev/urandom | base64 >"$SCRATCH/text/a.txt"
  fails_naming "tokenize: a shard" "tokens/train_000000.bin\": File too large" limited 64 "$DATA" tokenize \
    -i "$SCRATCH/text" -o "$SCRATCH/tokens" --val-fraction 0 -q
  [ -e "$SCRATCH/tokens/tokenize.incomplete" ] || problem "tokenize: no incomplete marker after the failed write"
  [ -z "$(ls "$SCRATCH/tokens" | grep '\.bin$')" ] || problem "tokenize: a shard was left: $(ls "$SCRATCH/tokens")"
  no_temporaries "tokenize: a shard" "$SCRATCH/tokens"
  fails_naming "tokenize: stdout" "standard output" to_full "$DATA" tokenize -i "$SCRATCH/text" \
    -o "$SCRATCH/tokens_stdout" --val-fraction 0
  fails_naming "sample: stdout" "standard output" to_full "$SAMPLE" --checkpoint "$SCRATCH/base" --prompt A \
    --max-new-tokens 8 --device cpu --threads 1 -q
else
  echo "note: no tokenizer here (scripts/fetch_tokenizer.sh): the pope-data tokenize and pope-sample cases are not run"
fi

# --- pope-eval: the CSV (≈ 2.6 KiB) and JSON past 1 KiB, and the table on a full stdout ---
E=("$EVAL" --checkpoint "$SCRATCH/base" --data "$SCRATCH/val.bin" --lengths 2:16:1 --device cpu --threads 1)
fails_naming "eval: --csv" "e.csv\": File too large" limited 1 "${E[@]}" --csv "$SCRATCH/e.csv"
fails_naming "eval: --json" "e.json\": File too large" limited 1 "${E[@]}" --json "$SCRATCH/e.json"
[ ! -e "$SCRATCH/e.csv" ] && [ ! -e "$SCRATCH/e.json" ] || problem "eval: a half-written --csv or --json was left"
no_temporaries "eval" "$SCRATCH"
fails_naming "eval: stdout" "standard output: No space left on device" to_full "${E[@]}"

# --- pope-export: modeling_pope.py (≈ 40 KiB) past 20 KiB; nothing under --out, no staging left ---
fails_naming "export: files" "modeling_pope.py\": File too large" limited 20 "$EXPORT" --checkpoint "$SCRATCH/base" \
  --out "$SCRATCH/export" --no-tokenizer
[ -z "$(ls -A "$SCRATCH" | grep export)" ] || problem "export: left $(ls -A "$SCRATCH" | grep export)"
fails_naming "export: stdout" "standard output" to_full "$EXPORT" --checkpoint "$SCRATCH/base" \
  --out "$SCRATCH/export2" --no-tokenizer

# --- a real full disk: a small tmpfs (root only) ---
MNT="$SCRATCH/mnt"
mkdir "$MNT"
if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=256k tmpfs "$MNT" 2>/dev/null; then
  trap 'umount "$MNT"; rm -rf "$SCRATCH"' EXIT
  # fill_leaving PAGES: fills the tmpfs with 4 KiB files, then frees PAGES of them.
  fill_leaving() {
    local i=0
    while head -c 4096 /dev/zero >"$MNT/fill_$i" 2>/dev/null; do i=$((i + 1)); done
    rm -f "$MNT/fill_$i"
    for _ in $(seq 1 "$1"); do i=$((i - 1)); rm -f "$MNT/fill_$i"; done
  }
  # A run that checkpointed, then the disk fills: the next checkpoint fails, step 4 stays resumable.
  cp -a "$SCRATCH/base" "$MNT/run"
  fill_leaving 2
  fails_naming "tmpfs: checkpoint" "No space left on device" "$TRAIN" --config "$SCRATCH/tiny.json" --out "$MNT/run" \
    -q --resume auto --stop-at 8
  rm -f "$MNT"/fill_*
  expect_exit 0 train --out "$MNT/run" -q --resume auto --stop-at 8
  grep -q "resumed from .*step_00000004 at step 4" "$MNT/run/train.log" ||
    problem "tmpfs: the run did not resume from step 4"
  # A new run on a disk with room for its lock and config.json only: never exit 0 leaving an empty metrics.jsonl.
  fill_leaving 2
  fails_naming "tmpfs: metrics.jsonl" "No space left on device" "$TRAIN" --config "$SCRATCH/tiny.json" \
    --out "$MNT/fresh" -q --no-checkpoints --set train.steps=5
  fails_naming "tmpfs: eval --json" "No space left on device" "${E[@]}" --json "$MNT/e.json"
  [ ! -e "$MNT/e.json" ] || problem "tmpfs: eval --json left a file"
  umount "$MNT"
  trap 'rm -rf "$SCRATCH"' EXIT
else
  echo "note: not root or no tmpfs mount here: the real full-disk (tmpfs) cases are not run"
fi

if [ ${#failures[@]} -gt 0 ]; then
  echo "FAIL: ${#failures[@]} case(s):" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "PASS"
