#!/usr/bin/env bash
# The in-distribution study script end to end on the CPU with its --quick model (two seeds per
# run): summary.json holds every run's final validation, gap.csv PoPE minus RoPE per group and
# seed, lengths.csv the perplexity of the base and bound runs; a second call continues the finished
# runs instead of refusing their directories; an unknown group exits 2 naming it.
source "$(dirname "$0")/cli_common.sh"
SCRIPT="$POPE_SOURCE_DIR/scripts/experiments/in_distribution.sh"
[ -x "$POPE_BIN/pope-train" ] && [ -x "$POPE_BIN/pope-eval" ] || { echo "SKIP: pope-train/pope-eval not built"; exit 77; }
[ -f "$POPE_SOURCE_DIR/data/demo/train.bin" ] && [ -d "$POPE_SOURCE_DIR/data/pg19_demo" ] ||
  { echo "SKIP: data/demo or data/pg19_demo missing (scripts/fetch_data.sh)"; exit 77; }
export POPE_BIN
OUT="$SCRATCH/ind"

expect_exit 2 "$SCRIPT" "$OUT" --quick --device cpu --groups "base sizes"
expect_output "unknown group 'sizes'"

expect_exit 0 "$SCRIPT" "$OUT" --quick --device cpu --groups "base bound epoch"
expect_output "| base: rope lr 0.001"
python3 - "$OUT" <<'PY' || fail "summary.json, gap.csv or lengths.csv incomplete"
import csv, json, sys
out = sys.argv[1]
rows = json.load(open(f"{out}/summary.json"))
runs = sorted(r["run"] for r in rows)
assert len(runs) == 12, runs  # base: 2 kinds × 2 seeds, bound: 2 × 2, epoch: 2 × 2
assert {r["seed"] for r in rows} == {1, 2}
assert all(r["val_loss"] > 0 for r in rows)
pope = [r for r in rows if r["kind"] == "pope"]
assert all(r["delta_outside"] is not None for r in pope), pope
assert {r["delta_bound"] for r in rows if r["group"] == "bound"} == {"none", "project"}
header = next(csv.reader(open(f"{out}/gap.csv")))
assert header == ["step", "base/seed_1", "base/seed_2", "epoch/seed_1", "epoch/seed_2"], header
labels = {r["label"] for r in csv.DictReader(open(f"{out}/lengths.csv"))}
assert len(labels) == 8, labels
PY
# Finished runs are continued (nothing left to train), not refused.
expect_exit 0 "$SCRIPT" "$OUT" --quick --device cpu --groups "base"
echo "PASS"
