#!/usr/bin/env bash
# A training file truncated while pope-train reads it: the run stops with an error naming the
# file (never SIGBUS, exit 135), its checkpoints stay loadable, and once the file is restored
# --resume auto continues from the newest.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }

make_tokens "$SCRATCH/train.bin" 400000 1
make_tokens "$SCRATCH/val.bin" 4000 2
cp "$SCRATCH/train.bin" "$SCRATCH/train.bin.saved"
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 1, "n_head": 2, "n_embd": 16,
            "context_length": 16, "position": {"kind": "rope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "train": {"steps": 100000, "batch_size": 4, "micro_batch_size": 4, "seq_len": 16, "log_every": 1,
            "eval_every": 0, "eval_batches": 1, "checkpoint_every": 2, "keep_checkpoints": 2, "threads": 1,
            "device": "cpu"}
}
JSON
RUN=(--config "$SCRATCH/tiny.json" --out "$SCRATCH/run" --resume auto -q)
saves() { grep -c '] info checkpoint ' "$SCRATCH/run/train.log" 2>/dev/null || true; }

"$TRAIN" "${RUN[@]}" >"$SCRATCH/train.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ "$(saves)" -ge 2 ] && break; sleep 0.1; done
[ "$(saves)" -ge 2 ] || { kill -KILL "$pid"; cat "$SCRATCH/train.out" >&2; fail "no checkpoint within 30 s"; }
# 100 tokens are left: nearly every window of the next batch lies past the new end.
truncate -s 200 "$SCRATCH/train.bin"
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$pid" 2>/dev/null && fail "pope-train still runs 60 s after its training file was truncated"
set +e; wait "$pid"; code=$?; set -e
[ "$code" -ne 135 ] || fail "pope-train died of SIGBUS reading the truncated file"
[ "$code" -ne 0 ] || fail "pope-train went on training from a truncated file"
grep -q "token file \"$SCRATCH/train.bin\" shrank while in use" "$SCRATCH/train.out" ||
  { cat "$SCRATCH/train.out" >&2; fail "the error does not name the truncated file (exit $code)"; }

latest=$(ls -d "$SCRATCH"/run/checkpoints/step_???????? | tail -1)
cp "$SCRATCH/train.bin.saved" "$SCRATCH/train.bin"
expect_exit 0 "$TRAIN" "${RUN[@]}" --stop-at $((10#${latest##*step_} + 2))
grep -q "resumed from .*${latest##*/}" "$SCRATCH/run/train.log" || fail "the run did not resume from ${latest##*/}"
echo "PASS"
