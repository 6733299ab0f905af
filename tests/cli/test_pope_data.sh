#!/usr/bin/env bash
# pope-data end to end on small fixtures in every input layout it reads: text files in nested
# directories, JSONL, .gz and .xz files, and the OpenWebText release layout (a tar.xz whose
# members are tar.xz subsets of .txt documents), made here with the real tar/xz/gzip tools.
# Checks the token streams against `pope-data encode` of each document, the split, sharding,
# inspect/decode, and the exit codes of usage (2) and data (1) errors.
set -euo pipefail
src="${POPE_SOURCE_DIR:?set by CTest}"
bin="${POPE_BIN:?set by CTest}"
[[ -f "$src/data/tokenizer/encoder.json" ]] ||
  { echo "SKIPPED: tokenizer files missing: run scripts/fetch_tokenizer.sh"; exit 77; }
export POPE_TOKENIZER_DIR="$src/data/tokenizer"
pd="$bin/pope-data"
"$pd" encode x >/dev/null 2>&1 || { echo "SKIPPED: pope-data cannot tokenize in this build: $("$pd" encode x 2>&1)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_exit CODE MESSAGE_PART COMMAND...: the command exits with CODE and says MESSAGE_PART.
expect_exit() {
  local want="$1" words="$2"
  shift 2
  local rc=0
  "$@" >"$tmp/out.txt" 2>&1 || rc=$?
  [[ $rc -eq $want ]] || fail "'$*' exited $rc, expected $want: $(cat "$tmp/out.txt")"
  grep -q -- "$words" "$tmp/out.txt" || fail "'$*' did not say '$words': $(cat "$tmp/out.txt")"
}

# The token stream of the given document files, each followed by <|endoftext|> (50256), as
# pope-data encode prints it for each file alone: the reference for whole corpora.
expected_stream() {
  local first=1 file
  printf '['
  for file in "$@"; do
    local ids
    ids="$("$pd" encode --file "$file")"
    ids="${ids#[}"
    ids="${ids%]}"
    [[ $first -eq 1 ]] || printf ','
    first=0
    [[ -n "$ids" ]] && printf '%s,' "$ids"
    printf '50256'
  done
  printf ']\n'
}

# text_file TEXT: a file holding TEXT (for expected_stream).
text_file() {
  local file
  file="$(mktemp -p "$tmp")"
  printf '%s' "$1" >"$file"
  echo "$file"
}

# The ids of a token file as a JSON array (decode --ids round trip is checked separately).
ids_of() { python3 -c "
import sys, struct
b = open(sys.argv[1], 'rb').read()
magic, version, n = struct.unpack_from('<3i', b)
assert magic == 20240520 and version == 1, 'not llm.c'
print('[' + ','.join(map(str, struct.unpack_from('<%dH' % n, b, 1024))) + ']')" "$1"; }

# --- plain text in nested directories (sorted walk, hidden files skipped) ---
mkdir -p "$tmp/plain/b" "$tmp/plain/a/.hidden"
printf 'Second document.\n' >"$tmp/plain/b/doc2.txt"
printf 'First  document, with <|endoftext|> as text.\n\n' >"$tmp/plain/a/doc1.txt"
printf 'never read' >"$tmp/plain/a/.hidden/x.txt"
printf 'never read' >"$tmp/plain/.dotfile"
"$pd" tokenize -i "$tmp/plain" -o "$tmp/o1" --val-fraction 0 --shard-tokens 0 -q
[[ "$(ids_of "$tmp/o1/train.bin")" == "$(expected_stream "$tmp/plain/a/doc1.txt" "$tmp/plain/b/doc2.txt")" ]] || fail "plain directory stream differs from per-document encodings"
[[ ! -e "$tmp/o1/val.bin" ]] || fail "val.bin written for --val-fraction 0"

# --- JSONL, gzip and xz, read by content and name ---
printf '{"text": "alpha beta"}\n\n{"body": "x", "text": "gamma\\u00e9"}\n' >"$tmp/docs.jsonl"
printf 'compressed text' | gzip >"$tmp/c.txt.gz"
cp "$tmp/docs.jsonl" "$tmp/d.jsonl" && xz "$tmp/d.jsonl"
"$pd" tokenize -i "$tmp/docs.jsonl" -i "$tmp/c.txt.gz" -i "$tmp/d.jsonl.xz" -o "$tmp/o2" \
  --val-fraction 0 --shard-tokens 0 -q
alpha="$(text_file "alpha beta")" gamma="$(text_file "gammaé")"
[[ "$(ids_of "$tmp/o2/train.bin")" == "$(expected_stream "$alpha" "$gamma" "$(text_file "compressed text")" "$alpha" "$gamma")" ]] ||
  fail "jsonl/gz/xz stream differs"
"$pd" tokenize -i "$tmp/docs.jsonl" -o "$tmp/o3" --text-field body --val-fraction 0 --shard-tokens 0 -q 2>"$tmp/err" &&
  fail "a JSONL line without the field was accepted"
grep -q "docs.jsonl:1: expected a JSON object with a string field 'body'" "$tmp/err" || fail "JSONL error: $(cat "$tmp/err")"

# --- OpenWebText layout: openwebtext.tar.xz ⊃ openwebtext/urlsf_subsetNN_data.xz (tar.xz) ⊃ *.txt ---
mkdir -p "$tmp/owt/openwebtext" "$tmp/subsets"
docs=()
for s in 0 1 2; do
  mkdir -p "$tmp/subsets/$s"
  for d in 0 1 2 3; do
    text="Subset $s, document $d: the quick brown fox   jumps.
Second line of $s/$d."
    printf '%s' "$text" >"$tmp/subsets/$s/$((s * 10 + d))-doc.txt"
    docs+=("$tmp/subsets/$s/$((s * 10 + d))-doc.txt")
  done
  (cd "$tmp/subsets/$s" && tar --sort=name -cJf "$tmp/owt/openwebtext/urlsf_subset0${s}-1_data.xz" ./*.txt)
done
(cd "$tmp/owt" && tar --sort=name -cJf "$tmp/openwebtext.tar.xz" openwebtext)
"$pd" tokenize -i "$tmp/openwebtext.tar.xz" -o "$tmp/o4" --val-fraction 0 --shard-tokens 0 -q
[[ "$(ids_of "$tmp/o4/train.bin")" == "$(expected_stream "${docs[@]}")" ]] || fail "OpenWebText layout stream differs"

# --- member names beyond ustar's 100 bytes: GNU long-name entries and pax headers ---
long="$(printf 'n%.0s' {1..150})"
mkdir -p "$tmp/long" && printf 'long named' >"$tmp/long/$long.txt" && printf 'short' >"$tmp/long/s.txt"
(cd "$tmp/long" && tar --sort=name --format=gnu -cf "$tmp/gnu.tar" ./*.txt && tar --sort=name --format=pax -cf "$tmp/pax.tar" ./*.txt)
"$pd" tokenize -i "$tmp/gnu.tar" -o "$tmp/o13" --per-document -q
"$pd" tokenize -i "$tmp/pax.tar" -o "$tmp/o14" --per-document -q
for o in o13 o14; do
  [[ -f "$tmp/$o/$long.bin" && -f "$tmp/$o/s.bin" ]] || fail "$o: long member name lost: $(ls "$tmp/$o")"
done

# --- split and shards: every document in exactly one split, same result on 1 and 2 threads ---
"$pd" tokenize -i "$tmp/openwebtext.tar.xz" -o "$tmp/o5" --val-fraction 0.5 --seed 7 --shard-tokens 40 -j 1 -q
"$pd" tokenize -i "$tmp/openwebtext.tar.xz" -o "$tmp/o6" --val-fraction 0.5 --seed 7 --shard-tokens 40 -j 2 -q
for f in "$tmp"/o5/*.bin; do cmp -s "$f" "$tmp/o6/$(basename "$f")" || fail "$(basename "$f") differs between 1 and 2 threads"; done
train_docs=0 val_docs=0
for f in "$tmp"/o5/train_*.bin; do train_docs=$((train_docs + $("$pd" inspect "$f" | sed -n 's/.*<|endoftext|>: \([0-9]*\).*/\1/p'))); done
for f in "$tmp"/o5/val_*.bin; do val_docs=$((val_docs + $("$pd" inspect "$f" | sed -n 's/.*<|endoftext|>: \([0-9]*\).*/\1/p'))); done
[[ $((train_docs + val_docs)) -eq 12 && $train_docs -gt 0 && $val_docs -gt 0 ]] ||
  fail "split: $train_docs train + $val_docs val documents, expected 12 in both splits"
[[ "$("$pd" inspect "$tmp/o5/train_000000.bin" | sed -n 's/ *tokens: //p')" == 40 ]] || fail "first shard is not 40 tokens"

# --- a corpus of one document is split by tokens: train is its head, val its last ⌈F·N⌉ tokens (⌈0.2·17⌉) ---
expect_exit 0 "one document, so it was split by tokens: its last 4 tokens are val" \
  "$pd" tokenize -i "$tmp/plain/a/doc1.txt" -o "$tmp/o13" --val-fraction 0.2 --shard-tokens 0
whole="$(expected_stream "$tmp/plain/a/doc1.txt")"
joined="$(ids_of "$tmp/o13/train.bin")$(ids_of "$tmp/o13/val.bin")"
[[ "${joined//][/,}" == "$whole" ]] || fail "one-document split: train + val = $joined, expected $whole"
"$pd" tokenize --help | grep -q "share of its tokens" || fail "--help does not tell how one document is split"

# --- per-document output, inspect and decode ---
"$pd" tokenize -i "$tmp/plain" -o "$tmp/o7" --per-document -q
[[ -f "$tmp/o7/doc1.bin" && -f "$tmp/o7/doc2.bin" ]] || fail "per-document files missing: $(ls "$tmp/o7")"
"$pd" decode "$tmp/o7/doc2.bin" >"$tmp/decoded"
[[ "$(cat "$tmp/decoded")" == "Second document.
<|endoftext|>" ]] || fail "decode: $(cat "$tmp/decoded")"
[[ "$("$pd" decode --ids 15496,995)" == "Hello world" ]] || fail "decode --ids"
"$pd" inspect "$tmp/o7/doc2.bin" | grep -q 'format: llm.c' || fail "inspect format"
"$pd" inspect "$tmp/o7/doc2.bin" | grep -q '"Second document.\\n<|endoftext|>"' || fail "inspect text"

# --- errors: usage → 2, data → 1, each with a message naming the problem ---
expect_exit 2 "Path does not exist" "$pd" tokenize -i "$tmp/missing" -o "$tmp/o8"
expect_exit 2 "required" "$pd" tokenize -i "$tmp/plain"
expect_exit 2 "not a token id" "$pd" decode --ids 70000
expect_exit 2 "--val-fraction" "$pd" tokenize -i "$tmp/plain" -o "$tmp/o8" --val-fraction 2
expect_exit 1 "already exists" "$pd" tokenize -i "$tmp/plain" -o "$tmp/o1" -q
printf 'not xz at all' | xz | head -c 30 >"$tmp/truncated.txt.xz"
expect_exit 1 "truncated.txt.xz: corrupt or truncated xz data" "$pd" tokenize -i "$tmp/truncated.txt.xz" -o "$tmp/o9" -q
head -c 700 "$tmp/openwebtext.tar.xz" | xz -dc 2>/dev/null | head -c 600 >"$tmp/broken.tar" || true
printf 'Z' | dd of="$tmp/broken.tar" bs=1 seek=0 conv=notrunc 2>/dev/null  # a name byte: checksum now wrong
expect_exit 1 "checksum mismatch" "$pd" tokenize -i "$tmp/broken.tar" -o "$tmp/o10" -q
printf 'a\0b' >"$tmp/binary.txt"
expect_exit 1 "NUL byte" "$pd" tokenize -i "$tmp/binary.txt" -o "$tmp/o11" -q
mkdir -p "$tmp/empty"
expect_exit 1 "no (non-empty) documents" "$pd" tokenize -i "$tmp/empty" -o "$tmp/o15" -q
mkdir -p "$tmp/o12" && printf 'garbage' >"$tmp/o12/bad.bin"
expect_exit 1 "bad.bin" "$pd" inspect "$tmp/o12/bad.bin"
expect_exit 1 "fetch_tokenizer.sh" env POPE_TOKENIZER_DIR="$tmp/none" "$pd" encode hello

# Without --tokenizer-dir and $POPE_TOKENIZER_DIR, from a directory with no data/tokenizer above
# it: an installed PREFIX/bin/pope-data reads PREFIX/share/pope/tokenizer, the build tree's binary
# the checkout's data/tokenizer, and a binary with neither lists every place it looked.
mkdir -p "$tmp/prefix/bin" "$tmp/prefix/share/pope/tokenizer" "$tmp/bare/bin" "$tmp/elsewhere"
cp "$pd" "$tmp/prefix/bin/pope-data"
cp "$pd" "$tmp/bare/bin/pope-data"
cp "$src/data/tokenizer/encoder.json" "$src/data/tokenizer/vocab.bpe" "$tmp/prefix/share/pope/tokenizer/"
expect_exit 0 "\[15496\]" env -C "$tmp/elsewhere" -u POPE_TOKENIZER_DIR "$tmp/prefix/bin/pope-data" encode Hello
if [[ "$(realpath "$bin")" == "$(realpath "$src")"/* ]]; then
  expect_exit 0 "\[15496\]" env -C "$tmp/elsewhere" -u POPE_TOKENIZER_DIR "$pd" encode Hello
fi
expect_exit 1 "not found" env -C "$tmp/elsewhere" -u POPE_TOKENIZER_DIR "$tmp/bare/bin/pope-data" encode Hello
for place in "$tmp/elsewhere/data/tokenizer" "$tmp/bare/share/pope/tokenizer" "$tmp/bare/bin/data/tokenizer" \
             "$tmp/bare/data/tokenizer" "fetch_tokenizer.sh"; do
  grep -qF -- "$place" "$tmp/out.txt" || fail "the not-found error does not list $place: $(cat "$tmp/out.txt")"
done

if [[ $failures -gt 0 ]]; then
  echo "test_pope_data: $failures failure(s)"
  exit 1
fi
echo "test_pope_data: all checks passed"
