#!/usr/bin/env bash
# pope-bench attention's command line: help, option errors (exit 2, naming the option) and, without
# a CUDA device or CUDA build, a clear runtime error (exit 1). The timings themselves need a GPU
# (scripts/bench_attention.sh).
source "$(dirname "$0")/cli_common.sh"
BENCH="$POPE_BIN/pope-bench"
[ -x "$BENCH" ] || { echo "SKIP: $BENCH not built"; exit 77; }

expect_exit 0 "$BENCH" --help
expect_output "attention"
expect_exit 0 "$BENCH" attention --help
for opt in --encodings --lengths --tokens --heads --head-dim --warmup --repeats --json --impl; do expect_output "$opt"; done

expect_exit 2 "$BENCH" attention --encodings rope,mystery
expect_output "mystery"
# Every model.position.kind is accepted (full, pj_rotary, …); the error lists them.
expect_exit 2 "$BENCH" attention --encodings full,pj_rotary,rope_affine,mystery
expect_output "'mystery'"
expect_output "lc_affine"
expect_exit 2 "$BENCH" attention --lengths 1024,40000
expect_output "--lengths"
expect_exit 2 "$BENCH" attention --repeats 0
expect_exit 2 "$BENCH" attention --impl flash
expect_output "--impl"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 1 "$BENCH" attention --lengths 64 --tokens 64
  expect_output "CUDA"
fi
echo "PASS"
