#!/usr/bin/env bash
# Plots a pope-eval CSV (perplexity versus length, one curve per label, log-scale y, the training
# length dashed) to a PNG, e.g. for results computed on the GPU machine, which has no gnuplot.
#   scripts/plot_lengths.sh CSV PNG [TRAIN_LEN]
# TRAIN_LEN marks only that length; by default each curve's train_length column is marked.
# Needs gnuplot (Debian: gnuplot-nox, see scripts/setup.sh) and a built pope-eval, which writes
# the gnuplot program (one source for this script and pope-eval --plot): $POPE_EVAL if set,
# else pope-eval on PATH, else PREFIX/bin/pope-eval when installed in PREFIX/share/pope/scripts,
# else the newest build/*/src/pope-eval of this checkout.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 CSV PNG [TRAIN_LEN]" >&2
  exit 2
fi
csv=$1 png=$2 train_len=${3:-0}

eval_bin=${POPE_EVAL:-}
if [ -z "$eval_bin" ]; then
  if command -v pope-eval >/dev/null 2>&1; then
    eval_bin=$(command -v pope-eval)
  elif [ -x "$(dirname "$0")/../../../bin/pope-eval" ]; then  # installed: PREFIX/share/pope/scripts
    eval_bin="$(dirname "$0")/../../../bin/pope-eval"
  else
    root=$(cd "$(dirname "$0")/.." && pwd)
    eval_bin=$(ls -t "$root"/build/*/src/pope-eval 2>/dev/null | head -1 || true)
  fi
fi
if [ -z "$eval_bin" ] || [ ! -x "$eval_bin" ]; then
  echo "$0: pope-eval not found: build it (ninja -C build/<dir> pope-eval), put it on PATH or set POPE_EVAL" >&2
  exit 1
fi
exec "$eval_bin" --plot-csv "$csv" --plot "$png" --train-len "$train_len"
