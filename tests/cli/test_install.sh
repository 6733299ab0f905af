#!/usr/bin/env bash
# cmake --install into a scratch prefix: the programs, the shipped configs, the user scripts and
# the documentation land there, and the installed tools work from a directory outside the
# checkout: `pope-train -c small_cpu` finds <prefix>/share/pope/configs, --version runs, and
# the installed fetch_tokenizer.sh fetches into <prefix>/share/pope/tokenizer by default.
source "$(dirname "$0")/cli_common.sh"
command -v cmake >/dev/null || { echo "SKIP: cmake not on PATH"; exit 77; }
BUILD_DIR="$(dirname "$POPE_BIN")"
PREFIX="$SCRATCH/prefix"

expect_exit 0 cmake --install "$BUILD_DIR" --prefix "$PREFIX"
for tool in pope-train pope-data pope-eval pope-sample pope-export pope-bench; do
  [ -x "$PREFIX/bin/$tool" ] || fail "$PREFIX/bin/$tool not installed"
done
for config in "$POPE_SOURCE_DIR"/configs/*.json; do
  cmp -s "$config" "$PREFIX/share/pope/configs/$(basename "$config")" || fail "$(basename "$config") not installed"
done
for script in fetch_tokenizer.sh plot_lengths.sh plot_loss.sh plot_accuracy.sh compare_runs.py; do
  [ -x "$PREFIX/share/pope/scripts/$script" ] || fail "share/pope/scripts/$script not installed executable"
done
for doc in README.md CHANGELOG.md docs/design.md docs/benchmarks.md configs/README.md data/README.md; do
  cmp -s "$POPE_SOURCE_DIR/$doc" "$PREFIX/share/doc/pope/$doc" || fail "share/doc/pope/$doc not installed"
done

# From outside the checkout. The config's data paths are relative to the working directory, so
# the dry run is given data files here; what is tested is that the bare name resolves.
mkdir "$SCRATCH/elsewhere"
cd "$SCRATCH/elsewhere"
make_tokens train.bin 4000 1
make_tokens val.bin 2000 2
expect_exit 0 "$PREFIX/bin/pope-train" -c small_cpu --dry-run --set data.train=train.bin --set data.val=val.bin
expect_output '"n_embd": 128'
expect_output "batch: "
expect_exit 2 "$PREFIX/bin/pope-train" -c no_such_config --dry-run
expect_output "$PREFIX/share/pope/configs"
expect_output "the working directory $SCRATCH/elsewhere and its parents"
for tool in pope-train pope-data pope-eval pope-sample pope-export pope-bench; do
  expect_exit 0 "$PREFIX/bin/$tool" --version
  expect_output "^$tool [0-9]"
done

# The installed plot script runs the installed pope-eval, with none on PATH (its error then names the CSV).
expect_exit 1 env -u POPE_EVAL PATH=/usr/bin:/bin "$PREFIX/share/pope/scripts/plot_lengths.sh" missing.csv out.png
expect_output "missing.csv"

# The tokenizer placed where the installed fetch script puts it is found by the installed tools.
if [ -f "$POPE_SOURCE_DIR/data/tokenizer/encoder.json" ]; then
  mkdir -p "$PREFIX/share/pope/tokenizer"
  cp "$POPE_SOURCE_DIR"/data/tokenizer/{encoder.json,vocab.bpe} "$PREFIX/share/pope/tokenizer/"
  expect_exit 0 env -u POPE_TOKENIZER_DIR "$PREFIX/bin/pope-data" encode Hello
  expect_output "15496"
  rm -r "$PREFIX/share/pope/tokenizer"
fi

# The installed fetch script's default directory, without fetching: every file "verified".
bash -c 'source "$1"; verify_sha256() { true; }; fetch_tokenizer_main' _ "$PREFIX/share/pope/scripts/fetch_tokenizer.sh" \
  >"$SCRATCH/out" 2>&1 || { cat "$SCRATCH/out" >&2; fail "the installed fetch_tokenizer.sh failed"; }
expect_output "verified in $PREFIX/share/pope/tokenizer\$"
echo "PASS"
