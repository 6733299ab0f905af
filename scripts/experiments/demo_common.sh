# Sourced by the experiments on the demo data (length_extrapolation.sh, in_distribution.sh):
#   demo_setup OUT_DIR   changes into the checkout; sets OUT_DIR (absolute), BIN (the directory holding
#                        pope-train and pope-eval: $POPE_BIN, else build/gpu/src, build/release/src or
#                        build/h/src of the checkout), RUNS and LOGS; checks data/demo and data/pg19_demo;
#                        starts OUT_DIR/commands.txt. Exits 1 naming what is missing.
#   run LOG CMD…         records the command in commands.txt, runs it with its output in logs/LOG.log,
#                        says how long it took; on failure prints the log's tail and exits 1.
# shellcheck shell=bash
demo_setup() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  mkdir -p "$1"
  OUT_DIR=$(cd "$1" && pwd)
  cd "$root" || exit 1
  BIN=${POPE_BIN:-}
  if [ -z "$BIN" ]; then
    for candidate in build/gpu/src build/release/src build/h/src; do
      [ -x "$candidate/pope-eval" ] && { BIN=$root/$candidate; break; }
    done
  fi
  [ -n "$BIN" ] && [ -x "$BIN/pope-train" ] && [ -x "$BIN/pope-eval" ] || {
    echo "$0: pope-train/pope-eval not found; build them or set POPE_BIN" >&2; exit 1; }
  for f in data/demo/train.bin data/demo/val.bin; do
    [ -f "$f" ] || { echo "$0: $f missing (scripts/fetch_data.sh)" >&2; exit 1; }
  done
  [ -d data/pg19_demo ] || { echo "$0: data/pg19_demo missing (scripts/fetch_data.sh)" >&2; exit 1; }
  RUNS=$OUT_DIR/runs LOGS=$OUT_DIR/logs
  mkdir -p "$RUNS" "$LOGS"
  : >"$OUT_DIR/commands.txt"
}

run() {
  local log=$1; shift
  printf '%q ' "$@" >>"$OUT_DIR/commands.txt"; echo >>"$OUT_DIR/commands.txt"
  local start=$SECONDS
  if ! "$@" >"$LOGS/$log.log" 2>&1; then
    tail -20 "$LOGS/$log.log" >&2
    echo "$0: '$*' failed; log in $LOGS/$log.log" >&2
    exit 1
  fi
  echo "$log: $((SECONDS - start)) s"
}
