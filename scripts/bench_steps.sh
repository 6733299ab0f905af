# Sourced by the GPU benchmark scripts (bench_gpu.sh, ab_gpu.sh, bench_vs_anchor.sh): the
# pope-bench train steps they time, and the overrides of their dry run without a GPU.
#   BENCH_STEPS  --steps/--warmup arguments: 10 timed steps after 3
#   BENCH_TINY   --set overrides to put after a call's own (later --set values win): empty, or with
#                POPE_BENCH_TINY=1 one layer 64 wide, 2 × 32 tokens, one timed step and no warmup
# shellcheck shell=bash disable=SC2034  # the variables are read by the scripts that source this
BENCH_STEPS=(--steps 10 --warmup 3)
BENCH_TINY=()
if [ "${POPE_BENCH_TINY:-0}" = 1 ]; then
  BENCH_STEPS=(--steps 1 --warmup 0)
  BENCH_TINY=(--set model.n_layer=1 --set model.n_embd=64 --set model.n_head=2 --set train.seq_len=32
              --set train.micro_batch_size=2 --set train.batch_size=2 --set train.threads=2)
fi
