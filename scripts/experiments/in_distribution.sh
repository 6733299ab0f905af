#!/usr/bin/env bash
# PoPE against RoPE at the training length on the demo data: which settings move PoPE's validation
# loss relative to RoPE's (docs/results/in-distribution.md). Every group is one pope-train process
# whose runs share the GPU (--vary, --seeds 1,2), all from configs/demo_pope_256.json (6 layers,
# 384 wide, context 256, 2,000 steps of 64 × 256 tokens):
#   base     kind = rope, pope (δ bound clamp, scale 1/√d)
#   bound    PoPE with delta_bound = none, project
#   scale    PoPE with scale = inv_sqrt_2d
#   lr       kind = rope, pope × optim.lr = 0.0005, 0.002 (the base has 0.001)
#   warmup   kind = rope, pope with 400 warm-up steps (the base has 100)
#   size     kind = rope, pope at the 124M shape (12 layers, 768 wide, 12 heads; lr 6e-4, min 6e-5)
#   epoch    kind = rope, pope for 880 steps, the schedule ending there: under one pass over data/demo
#            (898 steps of 16,384 tokens), where the base runs see every token about 2.2 times
# then perplexity at 256…2,048 tokens on data/pg19_demo of the base and bound runs (seed 1 and 2).
# Writes into OUT_DIR: runs/GROUP/…, logs/, commands.txt, summary.json (every run's final validation
# loss and δ shares), lengths.csv, gap.csv (PoPE minus RoPE validation loss per evaluation; gap.png with
# gnuplot), and prints the tables last.
#
#   scripts/experiments/in_distribution.sh OUT_DIR [--quick] [--device auto|cpu|cuda] [--groups "base bound …"]
#
# --quick: a 2-layer, 64-wide model and 3 steps, to check the pipeline on a CPU; its numbers mean nothing.
# Binaries: $POPE_BIN (the directory holding pope-train and pope-eval), else build/gpu/src,
# build/release/src or build/h/src of this checkout (scripts/experiments/demo_common.sh).
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [--quick] [--device auto|cpu|cuda] [--groups \"base bound scale lr warmup size epoch\"]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT_DIR=$1; shift
QUICK=0 DEVICE=auto GROUPS_RUN="base bound scale lr warmup size epoch"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --device) [ $# -ge 2 ] || usage; DEVICE=$2; shift ;;
    --groups) [ $# -ge 2 ] || usage; GROUPS_RUN=$2; shift ;;
    *) usage ;;
  esac
  shift
done
for g in $GROUPS_RUN; do
  case $g in base | bound | scale | lr | warmup | size | epoch) ;; *) echo "$0: unknown group '$g' (base bound scale lr warmup size epoch)" >&2; exit 2 ;; esac
done

# shellcheck source=scripts/experiments/demo_common.sh
source "$(dirname "$0")/demo_common.sh"
demo_setup "$OUT_DIR"

CONFIG=configs/demo_pope_256.json
COMMON=(--device "$DEVICE" --resume auto --quiet --seeds 1,2)
SIZE=(--set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768 --set optim.lr=0.0006 --set optim.min_lr=0.00006)
EPOCH=(--set train.steps=880 --set train.eval_every=220 --set train.checkpoint_every=880)
EVAL_SET=(--max-windows 64)
LENGTHS=256,512,1024,2048
if [ "$QUICK" -eq 1 ]; then
  COMMON+=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=64 --set train.steps=3 --set train.eval_every=3
           --set train.eval_batches=1 --set train.checkpoint_every=3 --set optim.warmup_steps=1 --set train.batch_size=4
           --set train.micro_batch_size=4 --set train.log_every=1)
  SIZE=(--set model.n_layer=3 --set optim.lr=0.0006)
  EPOCH=(--set train.steps=2 --set train.eval_every=2 --set train.checkpoint_every=2)
  EVAL_SET=(--max-windows 2)
  LENGTHS=64,128
fi

# group NAME ARGS…: one pope-train process training every run of the group.
group() {
  local name=$1; shift
  run "train_$name" "$BIN/pope-train" --config "$CONFIG" --out "$RUNS/$name" "${COMMON[@]}" "$@"
}
for g in $GROUPS_RUN; do
  case $g in
    base) group base --vary model.position.kind=rope,pope ;;
    bound) group bound --vary model.position.pope.delta_bound=none,project ;;
    scale) group scale --set model.position.pope.scale=inv_sqrt_2d ;;
    lr) group lr --vary model.position.kind=rope,pope --vary optim.lr=0.0005,0.002 ;;
    warmup) group warmup --vary model.position.kind=rope,pope --set optim.warmup_steps=400 ;;
    size) group size --vary model.position.kind=rope,pope "${SIZE[@]}" ;;
    epoch) group epoch --vary model.position.kind=rope,pope "${EPOCH[@]}" ;;
  esac
done

# Perplexity past the training length for the encodings and bounds, both seeds, in one call.
EVAL=()
for seed in 1 2; do
  for dir in base/kind_rope base/kind_pope bound/delta_bound_none bound/delta_bound_project; do
    [ -d "$RUNS/$dir/seed_$seed" ] && EVAL+=(--checkpoint "$RUNS/$dir/seed_$seed" --label "${dir#*/} seed $seed")
  done
done
if [ ${#EVAL[@]} -gt 0 ]; then
  run eval_lengths "$BIN/pope-eval" "${EVAL[@]}" --data data/pg19_demo --lengths "$LENGTHS" --device "$DEVICE" \
    "${EVAL_SET[@]}" --csv "$OUT_DIR/lengths.csv"
fi

python3 - "$RUNS" "$OUT_DIR/summary.json" "$OUT_DIR/lengths.csv" "$OUT_DIR/gap.csv" <<'PY'
import csv, glob, json, os, statistics, sys
runs, summary_path, lengths_path, gap_path = sys.argv[1:5]
rows = []
for metrics in sorted(glob.glob(f"{runs}/*/**/metrics.jsonl", recursive=True)):
    run = os.path.dirname(metrics)
    config = json.load(open(os.path.join(run, "config.json")))
    evals = [json.loads(l) for l in open(metrics) if '"event":"eval"' in l]
    if not evals:
        continue
    last = evals[-1]
    position = config["model"]["position"]
    pope = position.get("pope", {})
    rows.append({
        "run": os.path.relpath(run, runs), "group": os.path.relpath(run, runs).split(os.sep)[0],
        "kind": position["kind"], "delta_bound": pope.get("delta_bound", "clamp"),
        "scale": pope.get("scale", "inv_sqrt_d"), "lr": config["optim"]["lr"],
        "warmup": config["optim"]["warmup_steps"], "n_layer": config["model"]["n_layer"],
        "n_embd": config["model"]["n_embd"], "seed": config["train"].get("seed"), "step": last["step"],
        "val_loss": last["val_loss"], "delta_outside": last.get("delta_outside"),
        "delta_at_bound": last.get("delta_at_bound")})
with open(summary_path + ".tmp", "w") as f:
    json.dump(rows, f, indent=2)
os.replace(summary_path + ".tmp", summary_path)

def setting(r):
    pope = f" {r['delta_bound']} {r['scale']}" if r["kind"] == "pope" else ""
    return f"{r['group']}: {r['kind']}{pope} lr {r['lr']:g} warmup {r['warmup']} {r['n_layer']}×{r['n_embd']}"
settings = {}
for r in rows:
    settings.setdefault(setting(r), []).append(r)
print("| setting | val loss per seed | mean | δ past / on a bound (PoPE) |")
print("|---|---|---:|---|")
for name, rs in settings.items():
    rs.sort(key=lambda r: r["seed"])
    shares = " · ".join(f"{r['delta_outside']:.0%} / {r['delta_at_bound']:.0%}" for r in rs
                        if r["kind"] == "pope" and r["delta_outside"] is not None)
    print(f"| {name} | " + " / ".join(f"{r['val_loss']:.4f}" for r in rs)
          + f" | {statistics.mean(r['val_loss'] for r in rs):.4f} | {shares} |")
# PoPE's validation loss minus RoPE's at each evaluation, for the groups training both kinds.
gaps = {}
for metrics in sorted(glob.glob(f"{runs}/*/kind_pope/**/metrics.jsonl", recursive=True)):
    rope = metrics.replace(f"{os.sep}kind_pope{os.sep}", f"{os.sep}kind_rope{os.sep}")
    if not os.path.exists(rope):
        continue
    loss = [{j["step"]: j["val_loss"] for j in map(json.loads, open(m)) if j.get("event") == "eval"} for m in (metrics, rope)]
    name = os.path.relpath(os.path.dirname(metrics), runs).replace(f"kind_pope{os.sep}", "")
    gaps[name] = {step: loss[0][step] - loss[1][step] for step in loss[0] if step in loss[1]}
steps = sorted({step for g in gaps.values() for step in g})
with open(gap_path + ".tmp", "w") as f:
    f.write("step," + ",".join(gaps) + "\n")
    for step in steps:
        f.write(f"{step}," + ",".join(f"{g[step]:.5f}" if step in g else "" for g in gaps.values()) + "\n")
os.replace(gap_path + ".tmp", gap_path)
if os.path.exists(lengths_path):
    table = list(csv.DictReader(open(lengths_path)))
    labels = list(dict.fromkeys(r["label"] for r in table))
    lengths = sorted({int(r["length"]) for r in table})
    ppl = {(r["label"], int(r["length"])): float(r["perplexity"]) for r in table}
    print()
    print("| checkpoint | " + " | ".join(str(L) for L in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{ppl[(label, L)]:.1f}" for L in lengths) + " |")
PY
if command -v gnuplot >/dev/null 2>&1; then
  columns=$(head -n 1 "$OUT_DIR/gap.csv" | tr ',' '\n' | wc -l)
  gnuplot -e "set terminal pngcairo size 900,540 noenhanced; set output '$OUT_DIR/gap.png'; set datafile separator ',';
    set key outside right; set grid; set xlabel 'training step'; set ylabel 'val loss, PoPE − RoPE (nats)';
    set title 'PoPE minus RoPE validation loss (same seed)';
    plot for [c=2:$columns] '$OUT_DIR/gap.csv' using 1:c with linespoints title columnheader(c)" ||
    echo "$0: gnuplot failed; gap.csv is written" >&2
fi
echo "results in $OUT_DIR"
