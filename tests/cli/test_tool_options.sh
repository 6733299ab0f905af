#!/usr/bin/env bash
# The options of every tool and subcommand, read from their --help: each shows a plain type
# name (INT, FILE, {a,b}), not CLI11's TYPE:CHECK (TEXT:TEXT, INT:POSITIVE, FLOAT:FACTOR), and
# each integer option refuses -1 and a value beyond 64 bits with exit 2, naming the flag and
# the accepted range (an unsigned option read -1 as 2^64 − 1, a huge value as the type's maximum).
source "$(dirname "$0")/cli_common.sh"

COMMANDS=("pope-train" "pope-data tokenize" "pope-data inspect" "pope-data decode" "pope-data encode" "pope-eval"
          "pope-sample" "pope-export" "pope-bench train" "pope-bench attention" "pope-bench sample"
          "pope-bench encodings" "pope-data" "pope-bench")
integer_flags=0
for command in "${COMMANDS[@]}"; do
  read -r -a words <<<"$command"
  tool="$POPE_BIN/${words[0]}"
  [ -x "$tool" ] || fail "${words[0]} not built"
  expect_exit 0 "$tool" "${words[@]:1}" --help
  cp "$SCRATCH/out" "$SCRATCH/help"
  # An option line: its names, one space, its type. A type with a colon names a validator.
  if grep -E '^ +[^ ]+ [A-Z]+:' "$SCRATCH/help"; then fail "'$command --help' shows a validator in a type name"; fi
  while read -r flag; do
    for value in -1 99999999999999999999; do
      expect_exit 2 "$tool" "${words[@]:1}" "$flag" "$value"
      grep -Eq -- "^$flag: expected an integer from -?[0-9]+ to [0-9]+, got $value\$" "$SCRATCH/out" ||
        { cat "$SCRATCH/out" >&2; fail "'$command $flag $value' does not name the flag and its range"; }
    done
    integer_flags=$((integer_flags + 1))
  done < <(sed -nE 's/^ +(-[A-Za-z0-9],)?(--[a-z0-9-]+) U?INT\b.*/\2/p' "$SCRATCH/help")
done
# The tools have 30 integer options; fewer found means the help format changed under the sed.
[ "$integer_flags" -ge 30 ] || fail "found only $integer_flags integer options in the helps"

# Each value of a list is checked; CLI11 would read 010 as octal 8, so a leading 0 is refused.
expect_exit 2 "$POPE_BIN/pope-bench" attention --lengths 1,-3
expect_output "--lengths: expected an integer from 1 to 2147483647, got -3"
expect_exit 2 "$POPE_BIN/pope-bench" attention --lengths 1,010
expect_output "--lengths: expected an integer from 1 to 2147483647 without leading zeros, got 010"
echo "PASS ($integer_flags integer options)"
