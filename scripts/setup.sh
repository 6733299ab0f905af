#!/usr/bin/env bash
# Installs every Debian package pope needs to build, test and fetch its demo data.
# Idempotent: packages already present are skipped, so a second run is quick.
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ pkg-config git ca-certificates
  libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev
  libpcre2-dev liblzma-dev zlib1g-dev xz-utils
  libopenmpi-dev openmpi-bin   # mpirun launches data-parallel ranks (NCCL comes with the CUDA toolkit)
  python3 python3-numpy
  gnuplot-nox     # pope-eval --plot, scripts/plot_lengths.sh and scripts/plot_accuracy.sh
  time            # /usr/bin/time -v: the fault tests' memory bound on adversarial text
  python3-torch   # CPU PyTorch 1.13: the independent oracle (scripts/reference/torch_gpt.py) in the CLI tests
)
# Node.js and npm (tokenizer oracle, npm registry downloads): any installation will do, e.g. a
# nodesource nodejs that bundles npm and conflicts with Debian's npm package.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
