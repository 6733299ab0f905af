#!/usr/bin/env bash
# scripts/bench_attention.sh refuses bad settings before it runs anything (exit 2, naming what it
# expected), and scripts/attention_table.py turns rounds of pope-bench attention JSON into the
# medians and target ratios; the benchmark itself runs on the GPU machine by hand.
source "$(dirname "$0")/cli_common.sh"
BENCH="$POPE_SOURCE_DIR/scripts/bench_attention.sh"
TABLE="$POPE_SOURCE_DIR/scripts/attention_table.py"
export OUT="$SCRATCH/logs"

ROUNDS=0 expect_exit 2 bash "$BENCH"
expect_output "ROUNDS must be a whole number ≥ 1 (got '0')"
LENGTHS="1024, 4096" expect_exit 2 bash "$BENCH"
expect_output "LENGTHS takes sequence lengths separated by commas"
BUILD="$SCRATCH/nowhere" expect_exit 2 bash "$BENCH"
expect_output "$SCRATCH/nowhere/src/pope-bench not found"

# Two rounds: medians per (encoding, impl, T), the range, and the ratios from the medians.
round() {  # round FILE ROPE_FUSED ROPE_CUDNN POPE_FUSED
  cat >"$1" <<JSON
{"benchmark": "attention", "rows": [
  {"encoding": "rope", "impl": "fused", "seq_len": 1024, "qk_width": 64, "forward_backward_ms": $2},
  {"encoding": "rope", "impl": "cudnn", "seq_len": 1024, "qk_width": 64, "forward_backward_ms": $3},
  {"encoding": "pope", "impl": "fused", "seq_len": 1024, "qk_width": 128, "forward_backward_ms": $4}]}
JSON
}
round "$SCRATCH/r1.json" 0.40 0.50 0.60
round "$SCRATCH/r2.json" 0.44 0.50 0.66
cat >"$SCRATCH/sdpa.json" <<'JSON'
{"benchmark": "attention_sdpa_cudnn", "rows": [
  {"qk_width": 64, "seq_len": 1024, "forward_backward_ms": 0.55},
  {"qk_width": 128, "seq_len": 1024, "forward_backward_ms": 0.80}]}
JSON
expect_exit 0 python3 "$TABLE" --sdpa "$SCRATCH/sdpa.json" "$SCRATCH/r1.json" "$SCRATCH/r2.json"
expect_output "| rope (fused) | 0.420 (0.400–0.440) |"
expect_output "| rope (sdpa) | 0.550 |"
expect_output "| RoPE / cuDNN (≤ 1.10) | 0.840 |"
expect_output "| RoPE / PyTorch cuDNN (≤ 1.10) | 0.764 |"
expect_output "| PoPE / PyTorch cuDNN (128-wide q/k) (< 1) | 0.787 |"
expect_output "| PoPE / RoPE (≤ 1.15) | 1.500 |"
grep -q "ALiBi" "$SCRATCH/out" && fail "a ratio without rows was printed"
expect_output "| f+b ms, median of 2 round(s) |"

# bench_attention.sh writes a round as one file per encoding: rows join across files, and the
# rounds counted are the most values any row has, not the files.
per_encoding() {  # per_encoding FILE ENCODING MS
  echo "{\"rows\": [{\"encoding\": \"$2\", \"impl\": \"fused\", \"seq_len\": 4096, \"qk_width\": 64, \"forward_backward_ms\": $3}]}" >"$1"
}
per_encoding "$SCRATCH/n1.json" nope 1.00
per_encoding "$SCRATCH/f1.json" full 1.20
per_encoding "$SCRATCH/n2.json" nope 1.10
per_encoding "$SCRATCH/f2.json" full 1.32
expect_exit 0 python3 "$TABLE" "$SCRATCH/n1.json" "$SCRATCH/f1.json" "$SCRATCH/n2.json" "$SCRATCH/f2.json"
expect_output "| f+b ms, median of 2 round(s) | T = 4096 |"
expect_output "| full (fused) | 1.260 (1.200–1.320) |"
expect_output "| \`full\` / NoPE (≤ 1.10) | 1.200 |"
printf 'not json' >"$SCRATCH/bad.json"
expect_exit 1 python3 "$TABLE" "$SCRATCH/bad.json"
expect_output "round $SCRATCH/bad.json: not a benchmark JSON with rows"
echo '{"rows": [{"seq_len": 1024}]}' >"$SCRATCH/short.json"
expect_exit 1 python3 "$TABLE" "$SCRATCH/short.json"
expect_output "a row lacks forward_backward_ms, qk_width"
echo PASS
