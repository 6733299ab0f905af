#!/usr/bin/env bash
# Live oracle: the ids pope-data writes for all demo text (the normalised books and the training
# text of scripts/fetch_data.sh) equal those of js-tiktoken@1.0.21's gpt2 encoding, document by
# document. Skips (exit 77, with the reason) without node, the npm package or the demo text.
set -euo pipefail
src="${POPE_SOURCE_DIR:?set by CTest}"
bin="${POPE_BIN:?set by CTest}"
skip() { echo "SKIPPED: $*"; exit 77; }

command -v node >/dev/null || skip "node is not installed (scripts/setup.sh installs nodejs)"
[[ -f "$src/data/tokenizer/encoder.json" ]] || skip "tokenizer files missing: run scripts/fetch_tokenizer.sh"
"$bin/pope-data" --tokenizer-dir "$src/data/tokenizer" encode x >/dev/null 2>&1 ||
  skip "pope-data cannot tokenize in this build: $("$bin/pope-data" --tokenizer-dir "$src/data/tokenizer" encode x 2>&1)"
[[ -d "$src/data/sources/books" && -d "$src/data/sources/train" ]] ||
  skip "demo text missing: run scripts/fetch_data.sh"
oracle_dir="$src/data/tokenizer/oracle"
if [[ ! -f "$oracle_dir/node_modules/js-tiktoken/package.json" ]]; then
  npm install --silent --no-save --prefix "$oracle_dir" js-tiktoken@1.0.21 >/dev/null 2>&1 ||
    skip "could not 'npm install js-tiktoken@1.0.21' (registry unreachable?)"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
find "$src/data/sources/books" "$src/data/sources/train" -type f ! -name '.*' | sort >"$tmp/files"
args=()
while IFS= read -r file; do args+=(--input "$file"); done <"$tmp/files"
"$bin/pope-data" --tokenizer-dir "$src/data/tokenizer" tokenize "${args[@]}" --out "$tmp/out" \
  --shard-tokens 0 --val-fraction 0 --quiet
NODE_PATH="$oracle_dir/node_modules" node "$src/scripts/tokenizer_oracle.js" "$tmp/out/train.bin" "$tmp/files"
