#!/usr/bin/env bash
# scripts/multi_gpu_check.sh refuses bad arguments before it touches a GPU, the build or /tmp
# (exit 2, naming what it expected); the GPU runs themselves happen on the GPU machine by hand.
source "$(dirname "$0")/cli_common.sh"
CHECK="$POPE_SOURCE_DIR/scripts/multi_gpu_check.sh"
export OUT="$SCRATCH/logs"

expect_exit 2 bash "$CHECK" --ranks 4
expect_output "needs --scaling-only"
expect_exit 2 bash "$CHECK" --scaling-only --ranks 1
expect_output "whole number of GPUs ≥ 2, got '1'"
expect_exit 2 bash "$CHECK" --scaling-only --ranks four
expect_output "got 'four'"
expect_exit 2 bash "$CHECK" --scaling-only --ranks
expect_output "got ''"
expect_exit 2 bash "$CHECK" --no-faults 5
expect_output "whole number ≥ 10"
expect_exit 2 bash "$CHECK" --frobnicate
expect_output "got '--frobnicate'"
[ ! -e "$OUT" ] || fail "the refused calls created $OUT"
echo "multi_gpu_check arguments: ok"
