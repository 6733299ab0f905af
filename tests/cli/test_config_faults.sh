#!/usr/bin/env bash
# Hostile and careless config input to every tool that reads a config: each is refused with
# exit 2 and a message naming the file or the key, never a crash or a raw library error.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
BENCH="$POPE_BIN/pope-bench"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }

# Deep nesting (once a segfault wherever the value was quoted): refused naming the file or the key.
# 60,000 levels keep a --set value under the kernel's 128 KiB limit of one argument.
deep="$(python3 -c 'print("[" * 60000 + "]" * 60000)')"
printf '{"model": {"n_head": %s}}' "$deep" >"$SCRATCH/deep.json"
expect_exit 2 "$TRAIN" --config "$SCRATCH/deep.json" --dry-run
expect_output "deep.json: invalid JSON"
expect_output "nested deeper than 64 levels"
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set "model.n_head=$deep"
expect_output "model.n_head: expected a --set value nested at most 64 levels deep"
expect_exit 2 "$BENCH" train --config "$SCRATCH/deep.json" --device cpu
expect_output "deep.json: invalid JSON"

# Bytes that are not UTF-8 in a --set path: a config error naming the key, not a json type error.
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set "data.train=$(printf 'data/\xff\xfe.bin')"
expect_output "data.train: expected UTF-8 text, found the byte 0xFF at offset 5"

# Numbers bounded to what trains (lr 1e300 once checkpointed infinite weights); 1e3 steps is 1000.
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set optim.lr=1e300
expect_output "optim.lr: expected a number in (0, 10], found 1e+300"
# --dry-run checks the data files too: small ones stand in for the config's.
make_tokens "$SCRATCH/train.bin" 4000 1
make_tokens "$SCRATCH/val.bin" 2000 2
expect_exit 0 "$TRAIN" --config small_cpu --dry-run --set train.steps=1e3 \
  --set "data.train=$SCRATCH/train.bin" --set "data.val=$SCRATCH/val.bin"
expect_output '"steps": 1000'

# A misspelt key is answered with the close spellings; a section given a value lists its keys.
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set optim.lrr=1
expect_output "optim.lrr: unknown key (did you mean optim.lr?); the keys of optim are lr, min_lr"
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set optim=3
expect_output "optim: is a section (keys: lr, min_lr, .*); set optim.<key>"
printf '{"optim": 3}' >"$SCRATCH/section.json"
expect_exit 2 "$TRAIN" --config "$SCRATCH/section.json" --dry-run
expect_output "optim: is a section (keys: lr, min_lr, .*), found 3 (an integer); set optim.<key> (in .*section.json)"
printf '{"optim": {"lrr": 1}}' >"$SCRATCH/typo.json"
expect_exit 2 "$TRAIN" --config "$SCRATCH/typo.json" --dry-run
expect_output "optim.lrr: unknown key (did you mean optim.lr?).*typo.json"

# FP8 is refused where it cannot run, naming the key: on the CPU (by the config, or by the backend
# an auto device chose), for an unknown precision, and for an amax history outside [1, 1024].
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set train.precision=fp8 --set train.device=cpu
expect_output "train.precision: expected bf16 with train.device cpu: fp8 runs on the CUDA backend"
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set train.precision=fp16
expect_output 'train.precision: expected one of bf16, fp8; found "fp16"'
expect_exit 2 "$TRAIN" --config small_cpu --dry-run --set train.precision=fp8 --set train.fp8_amax_history=0
expect_output "train.fp8_amax_history: expected an integer in \[1, 1024\], found 0"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 2 "$TRAIN" --config indirect_indexing_pope --out "$SCRATCH/fp8_run" --set train.precision=fp8 --set train.steps=1
  expect_output "train.precision: expected bf16: cpu .* has no FP8 tensor cores"
fi

echo "PASS"
