#!/usr/bin/env bash
# The quickstart: install packages, build, fetch and tokenize the real demo text (Gutenberg
# books and a Brown + Debian-documentation training corpus), then train the small CPU model
# on it (configs/small_cpu.json; a few minutes on two cores), print its validation loss and a
# sample of its text (pope-sample).
# Run it again to continue or re-report the same run (runs/quickstart).
# Extra arguments go to pope-train, e.g.  scripts/quickstart.sh --set model.position.kind=rope
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)"
scripts/fetch_data.sh
build/release/src/pope-train --config small_cpu --out runs/quickstart --resume auto "$@"
echo "--- a sample of the trained model (pope-sample):"
build/release/src/pope-sample --checkpoint runs/quickstart --prompt "The" --max-new-tokens 48 --top-k 50 --seed 1
