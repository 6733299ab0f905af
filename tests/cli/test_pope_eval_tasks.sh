#!/usr/bin/env bash
# pope-eval's zero-shot tasks end to end on the CPU: a tiny PoPE model and a tiny RoPE model over
# the GPT-2 vocabulary score every task and the suite on the hand-written files of
# tests/data/zero_shot; then --json/--csv, several checkpoints, refused flags (exit 2), bad input
# naming its file and line, skips and --strict, and a RoPE model refusing examples past its
# training length (exit 1).
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
EVAL="$POPE_BIN/pope-eval"
[ -x "$TRAIN" ] && [ -x "$EVAL" ] || { echo "SKIP: pope-train or pope-eval not built"; exit 77; }
require_tokenizer
FIX="$POPE_SOURCE_DIR/tests/data/zero_shot"

make_tokens "$SCRATCH/train.bin" 20000 1
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 50257, "padded_vocab_size": 50304, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 64, "position": {"kind": "pope"}},
  "data": {"train": "$SCRATCH/train.bin"},
  "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2},
  "train": {"steps": 4, "batch_size": 4, "micro_batch_size": 4, "seq_len": 64, "log_every": 2,
            "eval_every": 0, "checkpoint_every": 0, "threads": 1, "device": "cpu"}
}
JSON
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/pope" -q
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=rope --out "$SCRATCH/rope" -q
E=("$EVAL" --checkpoint "$SCRATCH/pope" --device cpu --threads 1 -q)

# --help names the tasks, their files and the new flags.
expect_exit 0 "$EVAL" --help
for text in --data-dir --labels --strict --tokenizer-dir lambada_test.jsonl hellaswag_val.jsonl valid-labels.lst \
  ARC-Easy-Test.jsonl sentence_good cbtest_NE_test_2500ex.txt zero-shot-suite; do
  expect_output "$text"
done

# Every task on its hand-written file: the table, --json with every example, --csv per choice.
check_task() {  # TASK FILE EXAMPLES CHOICES METRICS...
  local task=$1 file=$2 examples=$3 choices=$4; shift 4
  expect_exit 0 "${E[@]}" --task "$task" --data "$file" --json "$SCRATCH/$task.json" --csv "$SCRATCH/$task.csv"
  expect_output "task "
  for metric in "$@"; do expect_output "$metric"; done
  python3 - "$SCRATCH/$task.json" "$SCRATCH/$task.csv" "$examples" "$choices" "$@" <<'PY' ||
import csv, json, sys
j, rows = json.load(open(sys.argv[1])), list(csv.DictReader(open(sys.argv[2])))
examples, choices, metrics = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
(run,) = next(iter(j["tasks"].values()))
assert run["examples_scored"] == examples and run["skipped_count"] == 0, run["examples_scored"]
assert len(run["examples"]) == examples and run["tokens_per_second"] > 0
for m in metrics:
    assert 0 <= run["metrics"][m]["value"], (m, run["metrics"])
assert len(rows) == choices, len(rows)
for e in run["examples"]:
    ll = [c["log_likelihood"] for c in e["choices"]]
    assert all(x < 0 for x in ll), ll
    assert e["line"] >= 1 and 0 <= e["gold"] < len(ll)
PY
    fail "--task $task: JSON/CSV check failed"
}
check_task lambada "$FIX/lambada_test.jsonl" 3 3 acc ppl
check_task hellaswag "$FIX/hellaswag_val.jsonl" 3 12 acc acc_norm
check_task piqa "$FIX/piqa/valid.jsonl" 3 6 acc acc_norm
check_task arc_easy "$FIX/ARC-Easy-Test.jsonl" 3 11 acc acc_norm
check_task blimp "$FIX/blimp" 5 10 acc
expect_output "determiner_noun_agreement_1"
check_task cbt "$FIX/cbtest_CN_test_2500ex.txt" 2 20 acc
expect_output "task cbt_cn"

# The suite: every task of the directory, one row per checkpoint, Table 6's columns and average.
expect_exit 0 "${E[@]}" --checkpoint "$SCRATCH/rope" --label pope --label rope --task zero-shot-suite \
  --data-dir "$FIX" --set model.position.rope.scaling.kind=dynamic_ntk --json "$SCRATCH/suite.json" \
  --csv "$SCRATCH/suite.csv"
expect_output "lambada     blimp    cbt_cn    cbt_ne hellaswag      piqa  arc_easy   average"
python3 - "$SCRATCH/suite.json" <<'PY' || fail "suite JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert [r["label"] for r in j["rows"]] == ["pope", "rope"], j["rows"]
for r in j["rows"]:
    cols = r["tasks"]
    assert list(cols) == ["lambada", "blimp", "cbt_cn", "cbt_ne", "hellaswag", "piqa", "arc_easy"] or \
        sorted(cols) == sorted(["lambada", "blimp", "cbt_cn", "cbt_ne", "hellaswag", "piqa", "arc_easy"]), cols
    acc = {k: 100 * c["metrics"]["acc"]["value"] for k, c in cols.items()}
    cbt = (acc.pop("cbt_cn") + acc.pop("cbt_ne")) / 2  # one of the paper's six tasks
    avg = (sum(acc.values()) + cbt) / 6
    assert abs(avg - r["average"]) < 1e-9, (avg, r["average"])
assert len(j["tasks"]["hellaswag"]) == 2
PY
[ "$(head -1 "$SCRATCH/suite.csv" | cut -d, -f1-3)" = "label,task,index" ] || fail "suite CSV header"
[ "$(grep -c '^label,' "$SCRATCH/suite.csv")" -eq 1 ] || fail "suite CSV: one header"

# RoPE without a scaling refuses an example past its training length (64), naming it: exit 1.
expect_exit 1 "$EVAL" --checkpoint "$SCRATCH/rope" --device cpu -q --task cbt --data "$FIX/cbtest_NE_test_2500ex.txt"
expect_output "cbtest_NE_test_2500ex.txt line 21"
expect_output "training length 64"

# Flags a mode does not read are refused (exit 2), naming the flag.
for bad in "--lengths 64" "--plot $SCRATCH/x.png" "--tail 8" "--max-windows 3" "--data-dir $FIX"; do
  # shellcheck disable=SC2086  # split the flag and its value
  expect_exit 2 "${E[@]}" --task lambada --data "$FIX/lambada_test.jsonl" $bad
  expect_output "${bad%% *}"
done
expect_exit 2 "${E[@]}" --task lambada --data "$FIX/lambada_test.jsonl" --labels "$FIX/piqa/valid-labels.lst"
expect_output "--labels"
expect_exit 2 "${E[@]}" --task zero-shot-suite --data "$FIX/lambada_test.jsonl"
expect_output "--data-dir"
expect_exit 2 "${E[@]}" --task hellaswag
expect_output "hellaswag_val.jsonl"
expect_exit 2 "${E[@]}" --task nosuchtask --data "$FIX/lambada_test.jsonl"
expect_exit 2 "${E[@]}" --data "$SCRATCH/train.bin" --lengths 32 --strict
expect_output "--strict"
expect_exit 2 "${E[@]}" --task indirect_indexing --tokenizer-dir "$POPE_TOKENIZER_DIR"
expect_output "--tokenizer-dir"

# Bad input: exit 1 naming the file and the line; a FIFO is refused rather than read.
printf '{"text": "a b"}\n{"text": 3}\n' >"$SCRATCH/bad.jsonl"
expect_exit 1 "${E[@]}" --task lambada --data "$SCRATCH/bad.jsonl"
expect_output "bad.jsonl line 2: field 'text' is an integer, expected a string"
printf '{"activity_label": "a", "ctx": "b", "endings": ["1", "2", "3", "4"], "label": 7}\n' >"$SCRATCH/hs.jsonl"
expect_exit 1 "${E[@]}" --task hellaswag --data "$SCRATCH/hs.jsonl"
expect_output "hs.jsonl line 1: label 7 is out of range 0..3"
: >"$SCRATCH/empty.jsonl"
expect_exit 1 "${E[@]}" --task arc_easy --data "$SCRATCH/empty.jsonl"
expect_output "is empty"
mkfifo "$SCRATCH/fifo.jsonl"
expect_exit 1 timeout 20 "${E[@]}" --task piqa --data "$SCRATCH/fifo.jsonl"
expect_output "not a regular file"
expect_exit 1 "${E[@]}" --task zero-shot-suite --data-dir "$SCRATCH"
expect_output "holds none of the suite's task files"

# Skips are counted and reported; --strict makes them an error.
printf '{"text": "one two"}\n{"text": "nospace"}\n' >"$SCRATCH/skip.jsonl"
expect_exit 0 "${E[@]}" --task lambada --data "$SCRATCH/skip.jsonl" --json "$SCRATCH/skip.json"
expect_output "skipped: $SCRATCH/skip.jsonl line 2: the text has no space"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["tasks"]["lambada"][0]; assert r["skipped_count"]==1 and r["skipped"][0]["line"]==2, r' \
  "$SCRATCH/skip.json" || fail "skips in the JSON"
expect_exit 1 "${E[@]}" --task lambada --data "$SCRATCH/skip.jsonl" --strict
expect_output "skip.jsonl line 2: the text has no space"
expect_output "--strict"

# --task indirect_indexing keeps its own checks.
expect_exit 2 "${E[@]}" --task indirect_indexing
expect_output "data.kind"
echo "pope-eval zero-shot tasks: all checks passed"
