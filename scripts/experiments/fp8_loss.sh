#!/usr/bin/env bash
# FP8 keeps the loss (docs/results/fp8-loss.md): the 124M and/or 774M model, RoPE and PoPE, trained
# on data/demo in bf16 and in FP8 (train.precision) from the same seed, so both precisions see the
# same batches in the same order; then, at every logged step after warm-up, FP8's training loss
# relative to bf16's on that same batch.
#   STEPS steps (default 500) of one micro-batch each (32 × 1024 tokens at 124M, 16 × 1024 at 774M),
#   100 warm-up steps to lr 6e-4, cosine to 6e-5, an evaluation every 100 steps, no checkpoints.
# Writes into OUT_DIR: runs/SIZE_KIND_PRECISION/, logs/, commands.txt, gap.csv (step, both losses
# and the relative gap per run pair), summary.json (the largest gap after warm-up and the final
# validation losses), loss.png and gap.png (with gnuplot), and prints the table last.
#
#   scripts/experiments/fp8_loss.sh OUT_DIR [124m] [774m]      (default: both)
#   scripts/experiments/fp8_loss.sh --plot-only OUT_DIR        the figures again from OUT_DIR/gap.csv
#   STEPS=N   steps per run (default 500; at least 101: the warm-up is 100)
#   KINDS="…" the encodings (default "rope pope")
# Binaries: $POPE_BIN, else build/gpu/src, build/release/src or build/h/src of this checkout
# (scripts/experiments/demo_common.sh). Needs a GPU with FP8 tensor cores (sm_89 or later).
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [124m] [774m] | $0 --plot-only OUT_DIR   (env STEPS, KINDS)" >&2; exit 2; }
[ $# -ge 1 ] || usage
PLOT_ONLY=0
if [ "$1" = --plot-only ]; then
  [ $# -eq 2 ] || usage
  PLOT_ONLY=1
  shift
fi
OUT_DIR=$1; shift
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(124m 774m)
for size in "${SIZES[@]}"; do
  case $size in 124m | 774m) ;; *) echo "$0: unknown size '$size' (expected 124m or 774m)" >&2; exit 2 ;; esac
done
STEPS=${STEPS:-500}
read -r -a KINDS <<<"${KINDS:-rope pope}"
for kind in "${KINDS[@]}"; do
  case $kind in rope | pope) ;; *) echo "$0: unknown encoding '$kind' in KINDS (expected rope or pope)" >&2; exit 2 ;; esac
done
WARMUP=100
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -gt "$WARMUP" ] ||
  { echo "$0: STEPS must be a whole number above the $WARMUP warm-up steps, got '$STEPS'" >&2; exit 2; }

# loss.png (both precisions' training loss) and gap.png (FP8's relative gap, the ±1% band) from
# gap.csv, with gnuplot when it is installed.
plot_gap_csv() {
  command -v gnuplot >/dev/null 2>&1 || { echo "$0: no gnuplot; gap.csv is written, plot it with --plot-only" >&2; return 0; }
  local pairs csv=$OUT_DIR/gap.csv
  pairs=$(tail -n +2 "$csv" | cut -d, -f1,2 | sort -u | tr ',' '_' | tr '\n' ' ')
  gnuplot -e "set terminal pngcairo size 900,540 noenhanced; set datafile separator ','; set grid; set key outside right;
    pairs = '$pairs'; pick(p, c) = (strcol(1).'_'.strcol(2) eq p) ? column(c) : 1/0;
    set xlabel 'training step'; set ylabel 'training loss'; set title 'bf16 and FP8 from one seed, data/demo';
    set output '$OUT_DIR/loss.png';
    plot for [p in pairs] '$csv' using 3:(pick(p, 4)) every ::1 with lines title p.' bf16', \
         for [p in pairs] '$csv' using 3:(pick(p, 5)) every ::1 with lines dashtype 2 title p.' fp8';
    set ylabel 'FP8 / bf16 − 1 (%)'; set title 'FP8 training loss relative to bf16 on the same batch';
    set output '$OUT_DIR/gap.png'; set yrange [-3:3];
    plot for [p in pairs] '$csv' using 3:(100 * pick(p, 6)) every ::1 with linespoints title p, \
         1 with lines lc 'black' dashtype 3 title '±1%', -1 with lines lc 'black' dashtype 3 notitle" ||
    echo "$0: gnuplot failed; gap.csv is written" >&2
}

if [ "$PLOT_ONLY" -eq 1 ]; then
  [ -f "$OUT_DIR/gap.csv" ] || { echo "$0: $OUT_DIR/gap.csv not found" >&2; exit 1; }
  plot_gap_csv
  exit 0
fi

# shellcheck source=scripts/experiments/demo_common.sh
source "$(dirname "$0")/demo_common.sh"
demo_setup "$OUT_DIR"

for size in "${SIZES[@]}"; do
  micro=32
  [ "$size" = 774m ] && micro=16
  for kind in "${KINDS[@]}"; do
    for precision in bf16 fp8; do
      name=${size}_${kind}_$precision
      rm -rf "${RUNS:?}/$name"
      run "$name" "$BIN/pope-train" --config "owt_$size" --out "$RUNS/$name" --device cuda --quiet --no-checkpoints \
        --set data.train=data/demo/train.bin --set data.val=data/demo/val.bin --set model.position.kind="$kind" \
        --set train.precision="$precision" --set train.steps="$STEPS" --set train.batch_size="$micro" \
        --set train.micro_batch_size="$micro" --set optim.warmup_steps="$WARMUP" --set train.eval_every=100 \
        --set train.eval_batches=10 --set train.log_every=10 --set train.seed=1
    done
  done
done

python3 - "$OUT_DIR" "$WARMUP" "${KINDS[*]}" "${SIZES[@]}" <<'PY'
import json, os, sys

out, warmup, kinds, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]


def records(run, event):
    with open(os.path.join(out, "runs", run, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("event") == event]


rows, summary = [], {}
for size in sizes:
    for kind in kinds:
        pair = {p: {r["step"]: r["loss"] for r in records(f"{size}_{kind}_{p}", "train")} for p in ("bf16", "fp8")}
        val = {p: records(f"{size}_{kind}_{p}", "eval")[-1]["val_loss"] for p in ("bf16", "fp8")}
        worst = 0.0
        for step in sorted(set(pair["bf16"]) & set(pair["fp8"])):
            gap = pair["fp8"][step] / pair["bf16"][step] - 1.0
            rows.append((size, kind, step, pair["bf16"][step], pair["fp8"][step], gap))
            if step > warmup:
                worst = max(worst, abs(gap))
        summary[f"{size}_{kind}"] = {"largest_gap_after_warmup": worst, "val_loss_bf16": val["bf16"],
                                     "val_loss_fp8": val["fp8"]}
with open(os.path.join(out, "gap.csv"), "w") as f:
    f.write("size,kind,step,loss_bf16,loss_fp8,relative_gap\n")
    for r in rows:
        f.write(f"{r[0]},{r[1]},{r[2]},{r[3]:.5f},{r[4]:.5f},{r[5]:.5f}\n")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(f"\n| run | largest |fp8/bf16 − 1| after step {warmup} | final val loss bf16 | fp8 |")
print("|---|---:|---:|---:|")
for name, s in summary.items():
    print(f"| {name} | {100 * s['largest_gap_after_warmup']:.2f}% | {s['val_loss_bf16']:.4f} | {s['val_loss_fp8']:.4f} |")
PY

plot_gap_csv
