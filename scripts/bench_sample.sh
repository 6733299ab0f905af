#!/usr/bin/env bash
# Generation speed beside its anchor on one GPU (docs/benchmarks.md, "Generation"): `pope-bench
# sample` and the PyTorch decode loop with a static KV cache under torch.compile(mode=
# "reduce-overhead") (scripts/reference/anchors/torch_decode_anchor.py), alternating, for each
# model size, encoding and batch; random prompt tokens, greedy. A table last.
# Usage: scripts/bench_sample.sh
# Env:   POPE_BENCH  pope-bench binary (default build/gpu/src/pope-bench)
#        SIZES (default "124m 774m"), ENCODINGS ("rope pope"), BATCHES ("1 32"),
#        PROMPT (128), NEW (256), OUT (logs and JSON, default /tmp/pope_sample_bench)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
POPE_BENCH="${POPE_BENCH:-build/gpu/src/pope-bench}"
SIZES="${SIZES:-124m 774m}"
ENCODINGS="${ENCODINGS:-rope pope}"
BATCHES="${BATCHES:-1 32}"
PROMPT="${PROMPT:-128}"
NEW="${NEW:-256}"
LOGS="${OUT:-/tmp/pope_sample_bench}"
[ -x "$POPE_BENCH" ] || { echo "bench_sample.sh: $POPE_BENCH not built" >&2; exit 2; }
for n in "$PROMPT" "$NEW"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench_sample.sh: PROMPT and NEW take positive whole numbers (got '$n')" >&2; exit 2; }
done
PYTHON="${PYTHON:-python3}"
mkdir -p "$LOGS"
declare -A CONFIG=([124m]=owt_124m [253m]=owt_253m [774m]=owt_774m)
rows=()
for size in $SIZES; do
  [ -n "${CONFIG[$size]:-}" ] || { echo "bench_sample.sh: unknown size '$size' (124m, 253m, 774m)" >&2; exit 2; }
  for kind in $ENCODINGS; do
    for batch in $BATCHES; do
      tag="${size}_${kind}_b${batch}"
      "$POPE_BENCH" sample --config "${CONFIG[$size]}" --device cuda --set model.position.kind="$kind" \
        --batch "$batch" --prompt-tokens "$PROMPT" --new-tokens "$NEW" --json "$LOGS/pope_$tag.json" \
        >"$LOGS/pope_$tag.txt" 2>&1 || { cat "$LOGS/pope_$tag.txt"; exit 1; }
      "$PYTHON" scripts/reference/anchors/torch_decode_anchor.py "$size" "$kind" "$batch" "$PROMPT" "$NEW" \
        >"$LOGS/anchor_$tag.txt" 2>&1 || { tail -20 "$LOGS/anchor_$tag.txt"; exit 1; }
      rows+=("$("$PYTHON" - "$LOGS/pope_$tag.json" "$LOGS/anchor_$tag.txt" "$size" "$kind" "$batch" <<'PY'
import json, sys
ours = json.load(open(sys.argv[1]))
anchor = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
o, a = ours["decode_tokens_per_second"], anchor["decode_tok_s"]
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {ours['prefill_tokens_per_second']:,.0f} | "
      f"{anchor['prefill_tok_s']:,} | {o:,.0f} | {a:,} | {o / a:.2f} |")
PY
)")
    done
  done
done
echo
echo "| size | encoding | batch | prefill tok/s (pope) | prefill (anchor) | decode tok/s (pope) | decode (anchor) | decode ratio |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
