#!/usr/bin/env bash
# scripts/bench_sample.sh refuses bad settings before it runs anything (exit 2, naming what it
# expected); the benchmark itself runs on the GPU machine by hand.
source "$(dirname "$0")/cli_common.sh"
BENCH="$POPE_SOURCE_DIR/scripts/bench_sample.sh"
export OUT="$SCRATCH/logs"
[ -x "$POPE_BIN/pope-bench" ] || { echo "SKIP: pope-bench not built"; exit 77; }
export POPE_BENCH="$POPE_BIN/pope-bench"

POPE_BENCH="$SCRATCH/nowhere" expect_exit 2 bash "$BENCH"
expect_output "$SCRATCH/nowhere not built"
PROMPT=abc expect_exit 2 bash "$BENCH"
expect_output "PROMPT and NEW take positive whole numbers (got 'abc')"
NEW=0 expect_exit 2 bash "$BENCH"
expect_output "(got '0')"
SIZES=1b expect_exit 2 bash "$BENCH"
expect_output "unknown size '1b'"
echo "bench_sample.sh arguments: all checks passed"
