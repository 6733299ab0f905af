#!/usr/bin/env bash
# scripts/experiments/fp8_loss.sh refuses bad arguments before it trains or writes anything (exit 2,
# naming what it expected), and --plot-only draws its figures from a gap.csv; its training runs need
# a GPU with FP8 tensor cores and happen on the GPU machine.
source "$(dirname "$0")/cli_common.sh"
SCRIPT="$POPE_SOURCE_DIR/scripts/experiments/fp8_loss.sh"
OUT="$SCRATCH/out_dir"

expect_exit 2 bash "$SCRIPT"
expect_output "usage:"
expect_exit 2 bash "$SCRIPT" "$OUT" 350m
expect_output "unknown size '350m' (expected 124m or 774m)"
expect_exit 2 env STEPS=100 bash "$SCRIPT" "$OUT" 124m
expect_output "STEPS must be a whole number above the 100 warm-up steps, got '100'"
expect_exit 2 env KINDS="rope alibi" bash "$SCRIPT" "$OUT" 124m
expect_output "unknown encoding 'alibi' in KINDS (expected rope or pope)"
[ ! -e "$OUT" ] || fail "the refused calls created $OUT"

expect_exit 1 bash "$SCRIPT" --plot-only "$OUT"
expect_output "$OUT/gap.csv not found"
mkdir -p "$OUT"
{
  echo "size,kind,step,loss_bf16,loss_fp8,relative_gap"
  for step in 0 10 20 30; do
    echo "124m,rope,$step,$((10 - step / 10)).0,$((10 - step / 10)).05,0.005"
    echo "124m,pope,$step,$((10 - step / 10)).1,$((10 - step / 10)).08,-0.002"
  done
} >"$OUT/gap.csv"
expect_exit 0 bash "$SCRIPT" --plot-only "$OUT"
if command -v gnuplot >/dev/null 2>&1; then
  for png in loss.png gap.png; do
    [ -s "$OUT/$png" ] || fail "--plot-only wrote no $png"
  done
else
  expect_output "no gnuplot"
fi
echo "fp8_loss arguments and plots: ok"
