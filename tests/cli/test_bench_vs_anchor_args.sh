#!/usr/bin/env bash
# scripts/bench_vs_anchor.sh refuses bad arguments before it runs or writes anything (exit 2,
# naming what it expected); its GPU runs happen on the GPU machine by hand.
source "$(dirname "$0")/cli_common.sh"
SCRIPT="$POPE_SOURCE_DIR/scripts/bench_vs_anchor.sh"
export OUT="$SCRATCH/logs" BUILD="$SCRATCH/no_build"

expect_exit 2 bash "$SCRIPT" 350m
expect_output "model size '350m' is not one the anchor runs (expected 124m or 774m)"
expect_exit 2 env ROUNDS=0 bash "$SCRIPT" 124m
expect_output "ROUNDS must be a whole number ≥ 1, got '0'"
expect_exit 2 env PRECISIONS=fp16 bash "$SCRIPT" 124m
expect_output "PRECISIONS holds 'fp16' (expected bf16 or fp8)"
expect_exit 2 env PRECISIONS=" " bash "$SCRIPT" 124m
expect_output "PRECISIONS is empty (expected bf16 and/or fp8)"
expect_exit 2 bash "$SCRIPT" 124m
expect_output "$SCRATCH/no_build/src/pope-bench not found"
[ ! -e "$OUT" ] || fail "the refused calls created $OUT"
echo "bench_vs_anchor arguments: ok"
