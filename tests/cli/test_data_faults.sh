#!/usr/bin/env bash
# Faults around token data: `pope-data tokenize` killed midway (the partial set is marked
# incomplete, readers refuse it, --overwrite cleans what it left), damaged headers,
# non-regular files where a token file is expected, a 13 MB word (bounded memory) and running
# out of memory (named, exit 1).
source "$(dirname "$0")/cli_common.sh"
DATA="$POPE_BIN/pope-data"
TRAIN="$POPE_BIN/pope-train"
[ -x "$DATA" ] && [ -x "$TRAIN" ] || { echo "SKIP: pope-data or pope-train not built"; exit 77; }
[ -f "$POPE_SOURCE_DIR/data/tokenizer/encoder.json" ] ||
  { echo "SKIP: tokenizer files missing: run scripts/fetch_tokenizer.sh"; exit 77; }
export POPE_TOKENIZER_DIR="$POPE_SOURCE_DIR/data/tokenizer"
"$DATA" encode x >/dev/null 2>&1 || { echo "SKIP: pope-data cannot tokenize in this build"; exit 77; }

# train_on SPEC: a one-step run on the GPT-2 vocabulary that reads SPEC as its training data
# (under a timeout: a reader blocked on a FIFO fails the test instead of hanging it).
cat >"$SCRATCH/gpt2.json" <<JSON
{
  "model": {"vocab_size": 50257, "padded_vocab_size": 50304, "n_layer": 1, "n_head": 2, "n_embd": 16,
            "context_length": 16, "position": {"kind": "rope"}},
  "train": {"steps": 1, "batch_size": 2, "micro_batch_size": 2, "seq_len": 16, "eval_every": 0,
            "threads": 1, "device": "cpu"}
}
JSON
train_on() {
  rm -rf "$SCRATCH/run"
  timeout 60 "$TRAIN" --config "$SCRATCH/gpt2.json" --set data.train="$1" --set data.val="$1" --out "$SCRATCH/run" --no-checkpoints
}

# --- tokenize killed midway: the first batch's shards are on disk, the second batch is not ---
mkdir "$SCRATCH/text"
head -c 13M /dev/urandom | base64 >"$SCRATCH/text/a.txt"  # > 16 MB: a batch of its own
head -c 9M /dev/urandom | base64 >"$SCRATCH/text/b.txt"
out="$SCRATCH/tokens"
"$DATA" tokenize -i "$SCRATCH/text" -o "$out" --val-fraction 0 --shard-tokens 100000 -j 1 -q &
pid=$!
for _ in $(seq 1 3000); do [ -e "$out/train_000000.bin" ] && break; sleep 0.02; done
kill -9 "$pid" 2>/dev/null || fail "pope-data tokenize finished before it could be killed"
wait "$pid" 2>/dev/null || true
[ -e "$out/train_000000.bin" ] || fail "no shard was written before the kill"
[ -e "$out/tokenize.incomplete" ] || fail "the killed run left no incomplete marker: $(ls -a "$out")"
for spec in "$out" "$out/train_000000.bin" "$out/train_*.bin"; do
  expect_exit 1 train_on "$spec"
  expect_output "is incomplete: \"$out/tokenize.incomplete\" exists"
  expect_output "run pope-data tokenize again with --overwrite"
done

# Without --overwrite the leftovers are refused; with it, shards, temporary files and the marker go.
expect_exit 1 "$DATA" tokenize -i "$SCRATCH/text/b.txt" -o "$out" --val-fraction 0 --shard-tokens 0 -q
expect_output "did not finish"
printf 'torn' >"$out/.train_000007.bin.Ab12Cd"
printf 'keep' >"$out/notes.txt"
printf 'hello world' >"$SCRATCH/small.txt"
"$DATA" tokenize -i "$SCRATCH/small.txt" -o "$out" --val-fraction 0 --shard-tokens 0 --overwrite -q
[ "$(ls -A "$out" | sort | tr '\n' ' ')" = "notes.txt train.bin " ] || fail "--overwrite left: $(ls -A "$out")"
expect_exit 1 train_on "$out/train.bin"  # complete now: refused only for being shorter than one window
expect_output "train.bin"
grep -q "incomplete" "$SCRATCH/out" && fail "a complete dataset was called incomplete: $(cat "$SCRATCH/out")"

# --- a shard whose magic is damaged is header damage, named as such, not headerless tokens ---
cp "$out/train.bin" "$SCRATCH/damaged.bin"
printf '\x00' | dd of="$SCRATCH/damaged.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
expect_exit 1 "$DATA" inspect "$SCRATCH/damaged.bin"
expect_output "damaged.bin\" has a damaged llm.c header"
expect_exit 1 train_on "$SCRATCH/damaged.bin"
expect_output "damaged llm.c header"

# --- non-regular files where a file is expected: refused for what they are, never blocking ---
mkfifo "$SCRATCH/fifo.bin"
ln -s loop2 "$SCRATCH/loop1" && ln -s loop1 "$SCRATCH/loop2"
expect_exit 1 timeout 20 "$DATA" inspect "$SCRATCH/fifo.bin"
expect_output "fifo.bin\" is a FIFO (named pipe), not a regular file"
expect_exit 1 timeout 20 "$DATA" inspect /dev/zero
expect_output "is a character device, not a regular file"
expect_exit 1 train_on "$SCRATCH/fifo.bin"
expect_output "is a FIFO (named pipe)"
expect_exit 1 train_on "$SCRATCH/loop1"
expect_output "loop1\" is a symbolic link loop"
expect_exit 1 timeout 20 "$DATA" tokenize -i "$SCRATCH/fifo.bin" -o "$SCRATCH/from_fifo" -q
expect_output "fifo.bin: is a FIFO (named pipe)"
expect_exit 1 timeout 20 "$DATA" encode --file "$SCRATCH/fifo.bin"
expect_output "fifo.bin: is a FIFO (named pipe)"
# A run's record as a FIFO (it would block the trainer in open(), past any signal): refused at
# start, by --dry-run too. timeout -s KILL: the blocked trainer would ignore SIGTERM.
make_tokens "$SCRATCH/small.bin" 4000 1
train_on "$SCRATCH/small.bin" >/dev/null 2>&1 || fail "the one-step run failed"
for record in metrics.jsonl train.log; do
  rm -f "$SCRATCH/run/$record" && mkfifo "$SCRATCH/run/$record"
  for dry in "" --dry-run; do
    expect_exit 2 timeout -s KILL 20 "$TRAIN" --config "$SCRATCH/gpt2.json" --set data.train="$SCRATCH/small.bin" \
      --out "$SCRATCH/run" --resume auto $dry
    expect_output "run/$record is a FIFO (named pipe), not a regular file"
  done
  rm "$SCRATCH/run/$record"
done

# --- adversarial text: one 13 MB "word" is BPE-merged in 64 KiB parts, so memory stays near the
# text's size (merged whole it took ~50 bytes per byte: 650 MB here, 4.9 GB for 100 MB) ---
head -c 12000000 /dev/urandom | base64 -w 0 | tr -d '+/0-9' >"$SCRATCH/word.txt"  # 13 MB of letters
if /usr/bin/time -f '%M' true >/dev/null 2>&1; then
  /usr/bin/time -o "$SCRATCH/rss" -f '%M' \
    "$DATA" tokenize -i "$SCRATCH/word.txt" -o "$SCRATCH/word" --val-fraction 0 --shard-tokens 0 -q
  rss_mb=$(( $(tail -1 "$SCRATCH/rss") / 1024 ))
  [ "$rss_mb" -lt 250 ] || fail "tokenizing a 13 MB word took $rss_mb MB of memory, expected < 250 MB"
else
  echo "SKIP (this case only): /usr/bin/time is missing, the memory of a 13 MB word is not measured"
fi

# --- out of memory: named with the file and what ran out, exit 1 (data error), no std::bad_alloc ---
head -c 100000000 /dev/zero | tr '\0' 'a' >"$SCRATCH/huge.txt"
limit_kb=150000
if (ulimit -v "$limit_kb" && "$DATA" encode hello) >/dev/null 2>&1; then
  expect_exit 1 bash -c "ulimit -v $limit_kb && exec '$DATA' tokenize -i '$SCRATCH/huge.txt' -o '$SCRATCH/huge' -q"
  expect_output "out of host memory while reading $SCRATCH/huge.txt"
  expect_exit 1 bash -c "ulimit -v $limit_kb && exec '$DATA' encode --file '$SCRATCH/huge.txt'"
  expect_output "out of host memory while encoding $SCRATCH/huge.txt"
  grep -q "bad_alloc" "$SCRATCH/out" && fail "the out-of-memory error says std::bad_alloc: $(cat "$SCRATCH/out")"
else
  echo "SKIP (this case only): pope-data does not start under ulimit -v $limit_kb (a sanitizer build?)"
fi
rm -f "$SCRATCH/huge.txt"

echo "PASS"
