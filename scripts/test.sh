#!/usr/bin/env bash
# The test command: set up packages, configure, build (CUDA code too when nvcc exists),
# fetch the tokenizer files and demo data, and run every test with CTest. GPU tests report
# SKIPPED on machines without a GPU.
# Usage: scripts/test.sh [ctest args…]     (PRESET=debug scripts/test.sh for sanitizers)
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET="${PRESET:-release}"

scripts/setup.sh
cmake --preset "$PRESET"
cmake --build --preset "$PRESET" -j "$(nproc)"
# Tokenizer files, test vectors and the demo corpora (pinned, idempotent: seconds when present).
POPE_DATA="build/$PRESET/src/pope-data" scripts/fetch_data.sh
ctest --preset "$PRESET" -j "$(nproc)" "$@"
