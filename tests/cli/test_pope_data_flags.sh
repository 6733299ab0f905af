#!/usr/bin/env bash
# pope-data's refusals of bad command lines, each exit 2 naming the word or flag: an unknown
# subcommand (it was "A subcommand is required"), negative values of unsigned options (they
# wrapped to 2^64 − 1: "show all tokens", "past the last token") and --ids with an empty
# element (it was ignored). All are found while parsing, before the tokenizer files are read,
# so this runs without them; the accepted forms then fail for the missing tokenizer (exit 1).
source "$(dirname "$0")/cli_common.sh"
DATA="$POPE_BIN/pope-data"
[ -x "$DATA" ] || { echo "SKIP: pope-data not built"; exit 77; }
export POPE_TOKENIZER_DIR="$SCRATCH/no_tokenizer"
make_tokens "$SCRATCH/tokens.bin" 100 1
mkdir "$SCRATCH/text"
echo "hello" >"$SCRATCH/text/a.txt"

expect_exit 2 "$DATA" frobnicate
expect_output "pope-data: 'frobnicate' is not a subcommand (expected one of tokenize, inspect, decode, encode)"
expect_exit 2 "$DATA" --frobnicate
expect_output "'--frobnicate' is not an option before the subcommand"

expect_exit 2 "$DATA" inspect "$SCRATCH/tokens.bin" -n -1
expect_output "--count: expected an integer from 0 to 18446744073709551615, got -1"
expect_exit 2 "$DATA" decode "$SCRATCH/tokens.bin" --start -1
expect_output "--start: expected an integer from 0 to 18446744073709551615, got -1"
expect_exit 2 "$DATA" decode "$SCRATCH/tokens.bin" --count -1
expect_output "--count: expected an integer from 0 to 18446744073709551615, got -1"
expect_exit 2 "$DATA" tokenize -i "$SCRATCH/text" -o "$SCRATCH/out_dir" --seed -1
expect_output "--seed: expected an integer from 0 to 18446744073709551615, got -1"
expect_exit 2 "$DATA" tokenize -i "$SCRATCH/text" -o "$SCRATCH/out_dir" --shard-tokens -1
expect_output "--shard-tokens"
expect_exit 2 "$DATA" tokenize -i "$SCRATCH/text" -o "$SCRATCH/out_dir" -j 100000
expect_output "--threads: expected an integer from 0 to 1024, got 100000"

expect_exit 2 "$DATA" decode --ids "1,"
expect_output "--ids: '1,' ends with an empty element"
expect_exit 2 "$DATA" decode --ids "1,,2"
expect_output "--ids: '1,,2' has an empty element"
expect_exit 2 "$DATA" decode --ids ""
expect_output "--ids: no ids in ''"
for bad in -1 +5 50257 x 1.5; do
  expect_exit 2 "$DATA" decode --ids "$bad"
  expect_output "--ids: '$bad' is not a token id"
done

# What is allowed passes the parse and stops only at the missing tokenizer.
allowed() {
  expect_exit 1 "$DATA" "$@"
  expect_output "fetch_tokenizer.sh"
}
allowed decode --ids 15496,995
allowed decode --ids "[15496, 995]"
allowed inspect "$SCRATCH/tokens.bin" -n 0
allowed decode "$SCRATCH/tokens.bin" --start 0 --count 3
allowed tokenize -i "$SCRATCH/text" -o "$SCRATCH/out_dir" --seed 7 -j 1024
echo "PASS"
