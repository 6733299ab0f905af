#!/usr/bin/env bash
# scripts/ab_gpu.sh refuses bad arguments before it copies, builds or writes anything (exit 2,
# naming what it expected); its GPU runs happen on the GPU machine by hand.
source "$(dirname "$0")/cli_common.sh"
AB="$POPE_SOURCE_DIR/scripts/ab_gpu.sh"
export OUT="$SCRATCH/logs"

expect_exit 2 bash "$AB"
expect_output "usage: scripts/ab_gpu.sh PATCH"
expect_exit 2 bash "$AB" one.patch two.patch
expect_output "got 2 arguments"
expect_exit 2 bash "$AB" "$SCRATCH/missing.patch"
expect_output "patch '$SCRATCH/missing.patch' not found"
# A change this tree does not contain: its reverse cannot apply.
cat >"$SCRATCH/foreign.patch" <<'PATCH'
--- a/README.md
+++ b/README.md
@@ -1,1 +1,1 @@
-# a first line this README never had
+# and another one
PATCH
expect_exit 2 bash "$AB" "$SCRATCH/foreign.patch"
expect_output "does not reverse cleanly"
# Settings that are not what they should be: refused by name, before anything is written.
printf '' >"$SCRATCH/empty.patch"
ROUNDS=two expect_exit 2 bash "$AB" "$SCRATCH/empty.patch"
expect_output "ROUNDS must be a whole number ≥ 0 (got 'two')"
MICRO=0 expect_exit 2 bash "$AB" "$SCRATCH/empty.patch"
expect_output "MICRO must be a positive whole number (got '0')"
LENGTHS="1024, 16384" expect_exit 2 bash "$AB" "$SCRATCH/empty.patch"
expect_output "got '1024, 16384'"
NCU_LENGTHS=16k expect_exit 2 bash "$AB" "$SCRATCH/empty.patch"
expect_output "got '16k'"
[ ! -e "$OUT" ] || fail "the refused calls created $OUT"
echo "ab_gpu arguments: ok"
