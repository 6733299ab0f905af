#!/usr/bin/env bash
# `--version` of every tool: exit 0, the project version of CMakeLists.txt, the commit it was
# built from (a commit of this checkout, or "unknown" outside one), the build type, the
# compiler and the CUDA runtime, cuDNN and NCCL versions (or "not built"), on stdout.
source "$(dirname "$0")/cli_common.sh"

version="$(sed -n 's/^project(pope VERSION \([0-9.]*\).*/\1/p' "$POPE_SOURCE_DIR/CMakeLists.txt")"
[ -n "$version" ] || fail "no project version in $POPE_SOURCE_DIR/CMakeLists.txt"

for tool in pope-train pope-data pope-eval pope-sample pope-export pope-bench; do
  [ -x "$POPE_BIN/$tool" ] || fail "$tool not built"
  expect_exit 0 "$POPE_BIN/$tool" --version
  [ "$(head -1 "$SCRATCH/out")" = "$tool $version" ] || { cat "$SCRATCH/out" >&2; fail "$tool: first line is not '$tool $version'"; }
  "$POPE_BIN/$tool" --version 2>/dev/null | grep -q "^$tool $version\$" || fail "$tool --version prints nothing on stdout"
  for field in "commit:" "build type:" "compiler:" "CUDA runtime:" "cuDNN:" "NCCL:"; do
    grep -Eq "^$field +[^ ]" "$SCRATCH/out" || { cat "$SCRATCH/out" >&2; fail "$tool --version lacks '$field'"; }
  done
  commit="$(sed -n 's/^commit: *\([^ ]*\).*/\1/p' "$SCRATCH/out")"
  if git -C "$POPE_SOURCE_DIR" rev-parse --git-dir >/dev/null 2>&1; then
    [[ "$commit" =~ ^[0-9a-f]{40}$ ]] && git -C "$POPE_SOURCE_DIR" cat-file -e "$commit^{commit}" ||
      fail "$tool --version: commit '$commit' is not a commit of $POPE_SOURCE_DIR"
  else
    [ "$commit" = unknown ] || fail "$tool --version: commit '$commit' outside a git checkout"
  fi
  # Each library is either a version (digits and dots) or "not built".
  for library in "CUDA runtime" cuDNN NCCL; do
    grep -Eq "^$library: +([0-9]+\.[0-9.]+|not built)" "$SCRATCH/out" ||
      { cat "$SCRATCH/out" >&2; fail "$tool --version: $library is neither a version nor 'not built'"; }
  done
  grep -Eq "^build type: +[A-Za-z]+" "$SCRATCH/out" || fail "$tool --version: no build type"
done

# --help lists the flag.
expect_exit 0 "$POPE_BIN/pope-train" --help
expect_output "--version"
echo "PASS"
