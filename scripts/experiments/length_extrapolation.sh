#!/usr/bin/env bash
# Length extrapolation on the demo data (issue 8, item 6; the paper's Figure 2 in small):
#   1. train RoPE and PoPE (configs/demo_{rope,pope}_256.json: 6 layers, 384 wide, 6 heads,
#      trained at 256 tokens, same budget) on data/demo;
#   2. fine-tune both at 4× the length (1024) from their weights with pope-train --init-from:
#      RoPE with YaRN s = 4 (demo_rope_256_ft1024_yarn.json), PoPE unchanged (demo_pope_256_ft1024.json);
#   3. train the other encodings of EXTRA_KINDS (default "xpos t5_bias") with RoPE's config and
#      budget, the kind changed, and no fine-tune;
#   4. sweep perplexity on the Gutenberg books (data/pg19_demo, one file per book) at 256..2560
#      (10× the training length) for RoPE, YaRN(ft), PoPE, PoPE+ft, the EXTRA_KINDS, and zero-shot
#      RoPE+YaRN (s = 4).
# Writes into OUT_DIR: runs/ (run directories), length_extrapolation.{csv,json}, .png when gnuplot is
# installed (else plot the CSV elsewhere with scripts/plot_lengths.sh), commands.txt and logs/.
#
#   scripts/experiments/length_extrapolation.sh OUT_DIR [--quick] [--device auto|cpu|cuda]
#
# --quick: a 2-layer, 64-wide model, 3 + 2 steps and 4 windows per length, to check the pipeline
# end to end in a minute or two on a CPU; its numbers mean nothing.
# Binaries: $POPE_BIN (the directory holding pope-train and pope-eval), else build/gpu/src,
# build/release/src or build/h/src of this checkout (scripts/experiments/demo_common.sh). Run from
# anywhere; paths in the configs are relative to the checkout, so the script changes into it.
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--quick] [--device auto|cpu|cuda]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT_DIR=$1; shift
QUICK=0 DEVICE=auto
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --device) [ $# -ge 2 ] || usage; DEVICE=$2; shift ;;
    *) usage ;;
  esac
  shift
done

# shellcheck source=scripts/experiments/demo_common.sh
source "$(dirname "$0")/demo_common.sh"
demo_setup "$OUT_DIR"

TRAIN_SET=() FT_SET=() EVAL_SET=()
LENGTHS=256:2560:256
if [ "$QUICK" -eq 1 ]; then
  MODEL=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64)
  SMALL=(--set train.eval_every=0 --set train.eval_batches=1 --set train.checkpoint_every=0 --set optim.warmup_steps=1)
  TRAIN_SET=("${MODEL[@]}" "${SMALL[@]}" --set train.steps=3 --set train.batch_size=4 --set train.micro_batch_size=4)
  FT_SET=("${MODEL[@]}" "${SMALL[@]}" --set train.steps=2 --set train.batch_size=2 --set train.micro_batch_size=2)
  EVAL_SET=(--max-windows 4)
fi

# Pretraining at 256, then the fine-tunes at 1024 from those weights. --resume auto makes a re-run
# continue (or skip) finished runs instead of refusing their directories.
for kind in rope pope; do
  run "train_$kind" "$BIN/pope-train" --config "configs/demo_${kind}_256.json" --out "$RUNS/$kind" \
    --device "$DEVICE" --resume auto "${TRAIN_SET[@]}"
done
EXTRA=()
for kind in ${EXTRA_KINDS-xpos t5_bias}; do
  run "train_$kind" "$BIN/pope-train" --config configs/demo_rope_256.json --set model.position.kind="$kind" \
    --out "$RUNS/$kind" --device "$DEVICE" --resume auto "${TRAIN_SET[@]}"
  EXTRA+=(--checkpoint "$RUNS/$kind" --label "$kind")
done
run train_rope_yarn_ft "$BIN/pope-train" --config configs/demo_rope_256_ft1024_yarn.json --out "$RUNS/rope_yarn_ft" \
  --init-from "$RUNS/rope" --device "$DEVICE" --resume auto "${FT_SET[@]}"
run train_pope_ft "$BIN/pope-train" --config configs/demo_pope_256_ft1024.json --out "$RUNS/pope_ft" \
  --init-from "$RUNS/pope" --device "$DEVICE" --resume auto "${FT_SET[@]}"

# The sweep: the four curves of the paper's figure in one call (the books are loaded once), and
# zero-shot YaRN on the RoPE model in a second (the scaling flags apply to every checkpoint).
run eval_main "$BIN/pope-eval" --checkpoint "$RUNS/rope" --checkpoint "$RUNS/rope_yarn_ft" \
  --checkpoint "$RUNS/pope" --checkpoint "$RUNS/pope_ft" --label RoPE --label "YaRN(ft)" --label PoPE \
  --label "PoPE+ft" "${EXTRA[@]}" --data data/pg19_demo --lengths "$LENGTHS" --tail 256 --device "$DEVICE" "${EVAL_SET[@]}" \
  --csv "$OUT_DIR/main.csv" --json "$OUT_DIR/main.json"
run eval_yarn_zero_shot "$BIN/pope-eval" --checkpoint "$RUNS/rope" --label "RoPE+YaRN(s=4 zero-shot)" \
  --rope-scaling yarn --rope-factor 4 --data data/pg19_demo --lengths "$LENGTHS" --tail 256 --device "$DEVICE" \
  "${EVAL_SET[@]}" --csv "$OUT_DIR/yarn_zero_shot.csv" --json "$OUT_DIR/yarn_zero_shot.json"

# One CSV (header once) and one JSON with every curve.
{ cat "$OUT_DIR/main.csv"; tail -n +2 "$OUT_DIR/yarn_zero_shot.csv"; } >"$OUT_DIR/length_extrapolation.csv.tmp"
mv "$OUT_DIR/length_extrapolation.csv.tmp" "$OUT_DIR/length_extrapolation.csv"
python3 - "$OUT_DIR/main.json" "$OUT_DIR/yarn_zero_shot.json" "$OUT_DIR/length_extrapolation.json" <<'PY'
import json, os, sys
main, extra = (json.load(open(p)) for p in sys.argv[1:3])
main["curves"] += extra["curves"]
with open(sys.argv[3] + ".tmp", "w") as f:
    json.dump(main, f, indent=2)
os.replace(sys.argv[3] + ".tmp", sys.argv[3])
PY
rm -f "$OUT_DIR"/main.csv "$OUT_DIR"/main.json "$OUT_DIR"/yarn_zero_shot.csv "$OUT_DIR"/yarn_zero_shot.json

if command -v gnuplot >/dev/null 2>&1; then
  run plot "$BIN/pope-eval" --plot-csv "$OUT_DIR/length_extrapolation.csv" --plot "$OUT_DIR/length_extrapolation.png"
else
  echo "gnuplot not installed: plot later with scripts/plot_lengths.sh $OUT_DIR/length_extrapolation.csv OUT.png"
fi
echo
python3 - "$OUT_DIR/length_extrapolation.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
labels = list(dict.fromkeys(r["label"] for r in rows))
lengths = sorted({int(r["length"]) for r in rows})
ppl = {(r["label"], int(r["length"])): float(r["perplexity"]) for r in rows}
print("| length | " + " | ".join(labels) + " |")
print("|---:|" + "---:|" * len(labels))
for L in lengths:
    print(f"| {L} | " + " | ".join(f"{ppl.get((l, L), float('nan')):.2f}" for l in labels) + " |")
PY
echo "results in $OUT_DIR"
