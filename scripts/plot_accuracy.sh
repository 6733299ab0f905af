#!/usr/bin/env bash
# Plots validation accuracy against the training step, one line per run, from the CSV that
# scripts/experiments/indirect_indexing.sh writes (header run,…,step,val_accuracy,…; the
# columns are found by name). Needs gnuplot (scripts/setup.sh installs gnuplot-nox).
# Usage: scripts/plot_accuracy.sh CSV PNG [TITLE]
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: scripts/plot_accuracy.sh CSV PNG [TITLE]" >&2
  exit 2
fi
CSV="$1"
PNG="$2"
TITLE="${3:-Indirect indexing: validation accuracy}"
if [ ! -r "$CSV" ]; then
  echo "plot_accuracy.sh: cannot read $CSV" >&2
  exit 1
fi
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot_accuracy.sh: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)" >&2
  exit 1
fi

header="$(head -n 1 "$CSV")"
column_of() {
  awk -F, -v name="$1" 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == name) { print i; exit } }' "$CSV"
}
RUN_COL="$(column_of run)"
STEP_COL="$(column_of step)"
ACC_COL="$(column_of val_accuracy)"
if [ -z "$RUN_COL" ] || [ -z "$STEP_COL" ] || [ -z "$ACC_COL" ]; then
  echo "plot_accuracy.sh: $CSV needs the columns run, step and val_accuracy; its header is: $header" >&2
  exit 1
fi
mapfile -t RUNS < <(awk -F, -v c="$RUN_COL" 'NR > 1 && !seen[$c]++ { print $c }' "$CSV")
if [ ${#RUNS[@]} -eq 0 ]; then
  echo "plot_accuracy.sh: $CSV holds no evaluations yet" >&2
  exit 1
fi

# One data block per run (separated by two blank lines) so that gnuplot's `index` selects it;
# the runs' names become the legend.
DATA="$(mktemp)"
trap 'rm -f "$DATA" "$PNG.tmp"' EXIT
for run in "${RUNS[@]}"; do
  awk -F, -v c="$RUN_COL" -v s="$STEP_COL" -v a="$ACC_COL" -v r="$run" \
    'NR > 1 && $c == r { print $s, 100 * $a }' "$CSV" | sort -n >>"$DATA"
  printf '\n\n' >>"$DATA"
done
plots=()
for i in "${!RUNS[@]}"; do
  plots+=("'$DATA' index $i using 1:2 with linespoints pointsize 0.5 title '${RUNS[$i]//\'/}'")
done
plot_list="$(IFS=,; echo "${plots[*]}")"

gnuplot <<GP
set terminal pngcairo size 1000,600 noenhanced font ",11"
set output "$PNG.tmp"
set datafile separator whitespace
set title "${TITLE//\"/}"
set xlabel "training step"
set ylabel "validation accuracy (%)"
set yrange [0:100]
set grid
set key outside right
plot $plot_list
GP
mv "$PNG.tmp" "$PNG"
trap - EXIT
rm -f "$DATA"
echo "wrote $PNG (${#RUNS[@]} runs)"
