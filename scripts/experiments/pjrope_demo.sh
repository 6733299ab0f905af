#!/usr/bin/env bash
# The PJ-RoPE demo experiment (issue 6, item 7): four small models on data/demo/ with the same
# budget (configs/pjrope_demo_{rope,pope,full,rope_ntk_affine}.json: 6 layers, 512 wide, 8 heads,
# context 256, 1500 steps of 32 × 256 tokens), then each one's validation loss and perplexity
# and, for the two with a PJ-bias (full, rope_ntk_affine), the PJ diagnostics with
# leave-one-order/sector-out ΔNLL on data/demo/val.bin.
#
#   scripts/experiments/pjrope_demo.sh [OUT_DIR] [extra pope-train arguments]
#
# OUT_DIR (default runs/pjrope_demo) gets one run directory per model, <model>/pj_diagnostics.json
# and .txt, and results.json + results.md (the table for docs/results/pjrope.md). Runs resume
# where they stopped, so the script can be re-run after an interruption. POPE_BIN names the
# directory holding pope-train and pope-eval (default build/release/src).
#
# Needs pope-eval with `--diagnostics --checkpoint DIR --data FILE --json FILE` and, on the GPU,
# the CUDA attention running the composed PJ methods (full, rope_ntk_affine); without the latter
# pass `--device cpu` (hours on a CPU for these sizes).
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=${POPE_BIN:-build/release/src}
out=${1:-runs/pjrope_demo}
[[ $# -gt 0 ]] && shift
models=(rope pope full rope_ntk_affine)
with_pj_bias=(full rope_ntk_affine)

for tool in pope-train pope-eval; do
  if [[ ! -x "$bin/$tool" ]]; then
    echo "pjrope_demo: $bin/$tool not found; build first or set POPE_BIN" >&2
    exit 2
  fi
done
for file in data/demo/train.bin data/demo/val.bin; do
  if [[ ! -f $file ]]; then
    echo "pjrope_demo: $file missing; run scripts/fetch_data.sh first" >&2
    exit 1
  fi
done
mkdir -p "$out"

for model in "${models[@]}"; do
  echo "== training $model"
  "$bin/pope-train" --config "configs/pjrope_demo_$model.json" --out "$out/$model" --resume auto "$@"
done

for model in "${with_pj_bias[@]}"; do
  echo "== PJ diagnostics of $model"
  "$bin/pope-eval" --diagnostics --checkpoint "$out/$model" --data data/demo/val.bin \
    --json "$out/$model/pj_diagnostics.json" | tee "$out/$model/pj_diagnostics.txt"
done

# The last evaluation of each run (metrics.jsonl, event "eval") → results.json and results.md,
# written through a temporary file and a rename so that a reader never sees half a file.
python3 - "$out" "${models[@]}" <<'PY'
import json, math, os, sys
out, models = sys.argv[1], sys.argv[2:]
results = {}
for model in models:
    evals = []
    with open(os.path.join(out, model, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "eval":
                evals.append(record)
    if not evals:
        sys.exit(f"pjrope_demo: {model} has no evaluation in its metrics.jsonl")
    last = evals[-1]
    entry = {"step": last["step"], "val_loss": last["val_loss"], "val_ppl": math.exp(last["val_loss"])}
    diagnostics = os.path.join(out, model, "pj_diagnostics.json")
    if os.path.exists(diagnostics):
        entry["diagnostics"] = os.path.relpath(diagnostics, out)
    results[model] = entry

def write(name, text):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)

write("results.json", json.dumps(results, indent=2) + "\n")
rows = ["| model | step | val loss | val ppl |", "|---|---|---|---|"]
rows += [f"| {m} | {r['step']} | {r['val_loss']:.4f} | {r['val_ppl']:.2f} |" for m, r in results.items()]
write("results.md", "\n".join(rows) + "\n")
print("\n".join(rows))
PY
