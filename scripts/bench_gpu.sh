#!/usr/bin/env bash
# Issue 4's GPU benchmark in one call on the GPU machine (planned for < 8 minutes on one H200; the
# anchor's torch.compile takes most of it and is cut off after ANCHOR_TIMEOUT_S, default 430 s):
#   1. pope-bench train, 124M (micro-batch 32) and 774M (micro-batch 16), RoPE and PoPE, T = 1024,
#      random tokens, 3 warmup + 10 timed steps each (one step = one micro-batch, as the anchor);
#   2. pope-bench train --profile once (124M PoPE): time per backend op; 124M RoPE and PoPE again
#      with train.deterministic=false (the attention backward's atomic dq);
#   3. the PyTorch oracle (scripts/reference/torch_gpt.py) on a bf16 GPU dump of each encoding
#      (124M shape cut to 2 layers, 4 × 256 tokens);
#   4. the PyTorch anchor (scripts/reference/anchors/torch_gpt_anchor.py: torch.compile, bf16
#      autocast, fused AdamW, SDPA) on the same four configs in the same run;
# then prints one Markdown table last: config, pope tok/s, anchor tok/s, ratio, MFU.
#
# Usage: scripts/bench_gpu.sh
# Env:   OUT          logs and JSON numbers (default /tmp/pope_bench_gpu)
#        BUILD        build directory (default build/gpu; pope-bench is built there if stale)
#        POPE_BENCH_DEVICE=cpu POPE_BENCH_TINY=1   a quick dry run of the script's pope parts on a
#                     machine without a GPU (tiny shapes; the anchor needs CUDA and is skipped)
#        PYTHON       python with torch for the oracle and the anchor (default python3 on PATH)
#        SKIP_ANCHOR=1  leave out the anchor (it spends most of its time in torch.compile)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LOGS="${OUT:-/tmp/pope_bench_gpu}"
BUILD="${BUILD:-build/gpu}"
DEVICE="${POPE_BENCH_DEVICE:-cuda}"
mkdir -p "$LOGS"
export PATH="/opt/torch/.venv/bin:$PATH"
PYTHON="${PYTHON:-python3}"  # the one with torch (on the GPU machine: /opt/torch/.venv/bin/python3)
BENCH="$BUILD/src/pope-bench"

# shellcheck source=scripts/bench_steps.sh
source scripts/bench_steps.sh  # BENCH_STEPS, BENCH_TINY

if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
fi
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')" \
  | tee "$LOGS/commit.txt"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1 ||
    { tail -40 "$LOGS/configure.log"; exit 1; }
fi
cmake --build "$BUILD" -j "$(nproc)" --target pope-bench >"$LOGS/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$LOGS/build.log" | head -40; exit 1; }

# size micro-batch config
CONFIGS=("124m 32 owt_124m" "774m 16 owt_774m")

# 1 + 2: pope-bench. The global batch is set to the micro-batch so that a step is one
# forward/backward + AdamW, like the anchor's.
for entry in "${CONFIGS[@]}"; do
  read -r size micro config <<<"$entry"
  for pos in rope pope; do
    profile=()
    [ "$size/$pos" = 124m/pope ] && profile=(--profile)
    log="$LOGS/pope_${size}_${pos}"
    "$BENCH" train --config "$config" --device "$DEVICE" "${BENCH_STEPS[@]}" "${profile[@]}" \
      --set model.position.kind="$pos" --set train.micro_batch_size="$micro" --set train.batch_size="$micro" \
      --set train.seq_len=1024 "${BENCH_TINY[@]}" --json "$log.json" >"$log.txt" 2>&1 ||
      { echo "pope-bench $size $pos failed:"; tail -5 "$log.txt"; }
    [ ${#profile[@]} -gt 0 ] && cat "$log.txt"
  done
done

# 1b: activation recompute lets 774M take twice the micro-batch (peak memory in the JSON).
log="$LOGS/pope_774m_rope_recompute"
"$BENCH" train --config owt_774m --device "$DEVICE" "${BENCH_STEPS[@]}" \
  --set model.position.kind=rope --set train.micro_batch_size=32 --set train.batch_size=32 --set train.seq_len=1024 \
  --set train.activation_recompute=true "${BENCH_TINY[@]}" --json "$log.json" >"$log.txt" 2>&1 ||
  { echo "pope-bench 774m recompute failed:"; tail -5 "$log.txt"; }

# 1c: the attention backward with atomic dq (train.deterministic=false), 124M RoPE and PoPE.
for pos in rope pope; do
  log="$LOGS/pope_124m_${pos}_atomic_dq"
  "$BENCH" train --config owt_124m --device "$DEVICE" "${BENCH_STEPS[@]}" \
    --set model.position.kind="$pos" --set train.micro_batch_size=32 --set train.batch_size=32 --set train.seq_len=1024 \
    --set train.deterministic=false "${BENCH_TINY[@]}" --json "$log.json" >"$log.txt" 2>&1 ||
    { echo "pope-bench 124m $pos atomic dq failed:"; tail -5 "$log.txt"; }
done

# 3: the independent PyTorch model against a bf16 dump of each encoding.
oracle_summary=()
for pos in nope rope pope alibi; do
  dump="$LOGS/dump_$pos.safetensors"
  extra=()
  [ "$pos" = pope ] && extra=(--set model.position.pope.delta_init=uniform)
  if "$BENCH" train --config owt_124m --device "$DEVICE" --dump-step "$dump" --set model.position.kind="$pos" \
      --set model.n_layer=2 --set train.micro_batch_size=4 --set train.batch_size=4 --set train.seq_len=256 \
      "${BENCH_TINY[@]}" "${extra[@]}" >"$LOGS/dump_$pos.log" 2>&1; then
    "$PYTHON" scripts/reference/torch_gpt.py "$dump" --device "$DEVICE" >"$LOGS/oracle_$pos.txt" 2>&1
    case $? in
      0) verdict="pass" ;; 77) verdict="skipped (no torch)" ;; *) verdict="FAIL" ;;
    esac
    details="$(grep -E '^(loss|MISMATCH|error):' "$LOGS/oracle_$pos.txt" | sed 's/ (tolerance[^)]*)//' | paste -sd ';' -)"
    oracle_summary+=("| oracle $pos | $verdict${details:+: $details} |")
  else
    oracle_summary+=("| oracle $pos | dump failed: $(tail -1 "$LOGS/dump_$pos.log") |")
  fi
done
rm -f "$LOGS"/dump_*.safetensors  # 124M-wide dumps are large; the logs keep the errors

# 4: the anchor (JSON lines), same GPU, same run.
: >"$LOGS/anchor.jsonl"
if [ "$DEVICE" = cuda ] && [ "${SKIP_ANCHOR:-0}" != 1 ]; then
  timeout "${ANCHOR_TIMEOUT_S:-430}" "$PYTHON" scripts/reference/anchors/torch_gpt_anchor.py train train774 >"$LOGS/anchor.jsonl" \
    2>"$LOGS/anchor.err" || { echo "anchor failed or timed out:"; tail -5 "$LOGS/anchor.err"; }
fi

echo
printf '%s\n' "| check | result |" "|---|---|" "${oracle_summary[@]}"
echo
python3 - "$LOGS" <<'PY'
import json, os, sys
logs = sys.argv[1]
anchor = {}
for line in open(os.path.join(logs, "anchor.jsonl")):
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        continue
    if r.get("kind") == "train":
        anchor[(r["size"], r["pos"])] = r
    elif r.get("kind") == "env":
        print(f"anchor: torch {r['torch']} on {r['gpu']}")


def cell(value, spec):
    return format(value, spec) if value is not None else "n/a"


print("| config | pope tok/s | anchor tok/s | pope / anchor | pope MFU | anchor MFU |")
print("|---|---:|---:|---:|---:|---:|")
for size, micro in (("124m", 32), ("774m", 16)):
    for pos in ("rope", "pope"):
        path = os.path.join(logs, f"pope_{size}_{pos}.json")
        ours = json.load(open(path)) if os.path.exists(path) else {}
        theirs = anchor.get((size, pos), {})
        ours_rate, theirs_rate = ours.get("tokens_per_second"), theirs.get("tok_s")
        ratio = ours_rate / theirs_rate if ours_rate and theirs_rate else None
        print(f"| {size.upper()} {pos}, B = {micro}, T = 1024 | {cell(ours_rate, ',.0f')} | {cell(theirs_rate, ',.0f')} "
              f"| {cell(ratio, '.2f')} | {cell(ours.get('mfu_vs_790'), '.3f')} | {cell(theirs.get('mfu_vs_790'), '.3f')} |")
for pos in ("rope", "pope"):
    path = os.path.join(logs, f"pope_124m_{pos}_atomic_dq.json")
    if os.path.exists(path):
        r = json.load(open(path))
        theirs = anchor.get(("124m", pos), {}).get("tok_s")
        ratio = r.get("tokens_per_second") / theirs if r.get("tokens_per_second") and theirs else None
        print(f"| 124M {pos}, B = 32, T = 1024, train.deterministic=false | {cell(r.get('tokens_per_second'), ',.0f')} "
              f"| {cell(theirs, ',.0f')} | {cell(ratio, '.2f')} | {cell(r.get('mfu_vs_790'), '.3f')} | |")
path = os.path.join(logs, "pope_774m_rope_recompute.json")
if os.path.exists(path):
    r = json.load(open(path))
    print(f"| 774M rope, B = 32, T = 1024, activation recompute | {cell(r.get('tokens_per_second'), ',.0f')} | | "
          f"| {cell(r.get('mfu_vs_790'), '.3f')} | |")
print()
for name in sorted(os.listdir(logs)):
    if name.startswith("pope_") and name.endswith(".json"):
        r = json.load(open(os.path.join(logs, name)))
        ms = lambda key: cell(1e3 * r[key], '.1f') if r.get(key) is not None else "n/a"
        memory = r.get("device_memory_bytes")
        print(f"{name[:-5]}: step {ms('median_step_seconds')} ms (forward {ms('forward_seconds')}, backward "
              f"{ms('backward_seconds')}, optimizer {ms('optimizer_seconds')}), device memory "
              f"{cell(memory / 2**30 if memory else None, '.1f')} GiB")
PY
