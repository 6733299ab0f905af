#!/usr/bin/env bash
# scripts/plot_loss.sh on the metrics.jsonl of real pope-train runs: a PNG for one or several runs,
# by step and by tokens, log-y; a missing, empty or malformed metrics.jsonl is an error naming the
# file (and line). The error cases need no gnuplot; the plots are skipped (exit 77) without it.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
PLOT="$POPE_SOURCE_DIR/scripts/plot_loss.sh"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 missing"; exit 77; }

write_tiny_config "$SCRATCH/tiny.json" '"steps": 12, "eval_every": 4'
for run in rope alibi; do
  expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=$run --out "$SCRATCH/$run" \
    --no-checkpoints -q
done

# --- errors: exit 1 naming the file (and the line), no PNG left; usage errors exit 2 ---
mkdir "$SCRATCH/empty" "$SCRATCH/bad" "$SCRATCH/torn" "$SCRATCH/nocfg"
: >"$SCRATCH/empty/metrics.jsonl"
{ head -n 2 "$SCRATCH/rope/metrics.jsonl"; echo '{"event":"train","st'; tail -n 2 "$SCRATCH/rope/metrics.jsonl"; } \
  >"$SCRATCH/bad/metrics.jsonl"
{ head -n 1 "$SCRATCH/rope/metrics.jsonl"; echo '{"event":"train","step":"one","loss":2.5}'; } >"$SCRATCH/bad2.jsonl"
mkdir "$SCRATCH/bad2" && mv "$SCRATCH/bad2.jsonl" "$SCRATCH/bad2/metrics.jsonl"
cp "$SCRATCH/rope/metrics.jsonl" "$SCRATCH/nocfg/"
expect_exit 1 "$PLOT" "$SCRATCH/missing" -o "$SCRATCH/x.png"
expect_output "$SCRATCH/missing/metrics.jsonl: no such file"
mkdir "$SCRATCH/fifo" && mkfifo "$SCRATCH/fifo/metrics.jsonl"
expect_exit 1 timeout 20 "$PLOT" "$SCRATCH/fifo" -o "$SCRATCH/x.png"
expect_output "$SCRATCH/fifo/metrics.jsonl: not a regular file"
expect_exit 1 "$PLOT" "$SCRATCH/rope" "$SCRATCH/empty" -o "$SCRATCH/x.png"
expect_output "$SCRATCH/empty/metrics.jsonl is empty"
expect_exit 1 "$PLOT" "$SCRATCH/bad/metrics.jsonl" -o "$SCRATCH/x.png"
expect_output "$SCRATCH/bad/metrics.jsonl:3: not a JSON object"
expect_exit 1 "$PLOT" "$SCRATCH/bad2" -o "$SCRATCH/x.png"
expect_output "$SCRATCH/bad2/metrics.jsonl:2: a \"train\" record needs an integer step"
expect_exit 1 "$PLOT" "$SCRATCH/nocfg" --x tokens -o "$SCRATCH/x.png"
expect_output "cannot read $SCRATCH/nocfg/config.json"
[ ! -e "$SCRATCH/x.png" ] || fail "a failed plot left $SCRATCH/x.png"
expect_exit 2 "$PLOT" "$SCRATCH/rope"
expect_output "-o PNG is required"
expect_exit 2 "$PLOT" "$SCRATCH/rope" --x epochs -o "$SCRATCH/x.png"
expect_output "--x epochs: expected step or tokens"
expect_exit 2 "$PLOT" -o "$SCRATCH/x.png"
expect_output "no run given"

# Without gnuplot on PATH: a clear error once the input is read.
mkdir "$SCRATCH/bin"
ln -s "$(python3 -c 'import sys; print(sys.executable)')" "$SCRATCH/bin/python3"  # not a launcher shim
ln -s "$(command -v dirname)" "$SCRATCH/bin/dirname"
expect_exit 1 env PATH="$SCRATCH/bin" "$(command -v bash)" "$PLOT" "$SCRATCH/rope" -o "$SCRATCH/x.png"
expect_output "gnuplot is not installed"

command -v gnuplot >/dev/null 2>&1 || { echo "SKIP: gnuplot missing (the error cases passed)"; exit 77; }
is_png() { [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$1 is not a PNG"; }

# --- plots: several runs by step, by tokens with log-y, a torn last line skipped with a warning ---
expect_exit 0 "$PLOT" "$SCRATCH/rope" "$SCRATCH/alibi" -o "$SCRATCH/steps.png"
expect_output "wrote $SCRATCH/steps.png (2 run(s), x = step)"
is_png "$SCRATCH/steps.png"
expect_exit 0 "$PLOT" "$SCRATCH/rope/metrics.jsonl" "$SCRATCH/alibi/" --x tokens --log-y --title "tiny" \
  -o "$SCRATCH/tokens.png"
is_png "$SCRATCH/tokens.png"
cmp -s "$SCRATCH/steps.png" "$SCRATCH/tokens.png" && fail "--x tokens --log-y drew the same plot as the default"
cp "$SCRATCH/rope/config.json" "$SCRATCH/torn/"
{ cat "$SCRATCH/rope/metrics.jsonl"; printf '{"event":"train","step":13,"lo'; } >"$SCRATCH/torn/metrics.jsonl"
expect_exit 0 "$PLOT" "$SCRATCH/torn" -o "$SCRATCH/torn.png"
expect_output "warning: $SCRATCH/torn/metrics.jsonl:$(( $(wc -l <"$SCRATCH/rope/metrics.jsonl") + 1 )): skipping the torn last line"
is_png "$SCRATCH/torn.png"
[ -z "$(ls "$SCRATCH" | grep '\.tmp')" ] || fail "temporary files left: $(ls "$SCRATCH")"
echo "PASS"
