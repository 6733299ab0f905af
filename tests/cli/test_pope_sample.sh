#!/usr/bin/env bash
# pope-sample end to end on the CPU: tiny PoPE and RoPE runs over a 64-token vocabulary (GPT-2 ids
# 0..63 are single printable characters), then greedy determinism, seeds, stdin prompts, stop
# strings, --json, generation past the training length (PoPE) and its refusal (RoPE), and the
# exit codes of bad flags (2) and unreadable checkpoints (1).
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
SAMPLE="$POPE_BIN/pope-sample"
[ -x "$TRAIN" ] && [ -x "$SAMPLE" ] || { echo "SKIP: pope-train or pope-sample not built"; exit 77; }
require_tokenizer

make_tokens "$SCRATCH/train.bin" 40000 1
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 32, "position": {"kind": "pope"}},
  "data": {"train": "$SCRATCH/train.bin"},
  "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "train": {"steps": 30, "batch_size": 8, "micro_batch_size": 8, "seq_len": 32, "log_every": 10,
            "eval_every": 0, "checkpoint_every": 0, "threads": 1, "device": "cpu"}
}
JSON
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/pope" -q
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=rope --out "$SCRATCH/rope" -q

S=("$SAMPLE" --checkpoint "$SCRATCH/pope" --device cpu --threads 1 -q)

# --help documents every option.
expect_exit 0 "$SAMPLE" --help
for flag in --checkpoint --prompt --prompt-file --max-new-tokens --temperature --top-k --top-p --seed \
  --num-samples --stop --ignore-eot --json --set --device --threads --tokenizer-dir --quiet; do
  expect_output "$flag"
done

# Greedy decoding is deterministic; the prompt comes first, then max-new-tokens tokens.
expect_exit 0 "${S[@]}" --prompt "A" --temperature 0 --max-new-tokens 20 --json "$SCRATCH/greedy.json"
cp "$SCRATCH/out" "$SCRATCH/greedy1"
expect_exit 0 "${S[@]}" --prompt "A" --temperature 0 --max-new-tokens 20
cmp -s "$SCRATCH/out" "$SCRATCH/greedy1" || fail "greedy decoding differs between two runs"
head -c 1 "$SCRATCH/greedy1" | grep -q "A" || fail "the output does not start with the prompt"
python3 - "$SCRATCH/greedy.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["samples"]
assert len(s) == 1 and d["prompt"] == "A" and d["prompt_tokens"] == [32], d
assert len(s[0]["tokens"]) == 20 == len(s[0]["log_probabilities"]), s[0]
assert all(p <= 0 for p in s[0]["log_probabilities"]), s[0]["log_probabilities"]
assert all(0 <= t < 64 for t in s[0]["tokens"]) and s[0]["stop_reason"] == "max_new_tokens"
assert d["decode_tokens_per_second"] > 0
PY

# The same seed samples the same text, another seed (almost surely) another; stdin as the prompt.
expect_exit 0 "${S[@]}" --prompt "A" --seed 5 --max-new-tokens 40 --top-k 20 --top-p 0.9
cp "$SCRATCH/out" "$SCRATCH/seed5"
expect_exit 0 bash -c "printf A | $(printf '%q ' "${S[@]}") --seed 5 --max-new-tokens 40 --top-k 20 --top-p 0.9"
cmp -s "$SCRATCH/out" "$SCRATCH/seed5" || fail "the same seed through stdin sampled another text"
expect_exit 0 "${S[@]}" --prompt "A" --seed 6 --max-new-tokens 40 --top-k 20 --top-p 0.9
cmp -s "$SCRATCH/out" "$SCRATCH/seed5" && fail "seeds 5 and 6 sampled the same 40 tokens"

# Several samples, each headed.
expect_exit 0 "${S[@]}" --prompt "A" --num-samples 3 --max-new-tokens 5
[ "$(grep -c -- '--- sample' "$SCRATCH/out")" -eq 3 ] || fail "--num-samples 3 did not print three samples"

# A stop string ends the sample before it: cut the greedy continuation at its 8th character.
stop="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples"][0]["text"][8:10])' "$SCRATCH/greedy.json")"
expect_exit 0 "${S[@]}" --prompt "A" --temperature 0 --max-new-tokens 20 --stop "$stop" --json "$SCRATCH/stop.json"
python3 - "$SCRATCH/greedy.json" "$SCRATCH/stop.json" "$stop" <<'PY'
import json, sys
full = json.load(open(sys.argv[1]))["samples"][0]["text"]
cut = json.load(open(sys.argv[2]))["samples"][0]
stop = sys.argv[3]
assert cut["stop_reason"] == "stop", cut
assert cut["text"] == full[: full.find(stop)], (cut["text"], full, stop)
PY

# Past the training length (32): PoPE generates, RoPE without a scaling refuses naming the limit.
expect_exit 0 "${S[@]}" --prompt "A" --temperature 0 --max-new-tokens 60
expect_exit 2 "$SAMPLE" --checkpoint "$SCRATCH/rope" --device cpu -q --prompt "A" --max-new-tokens 60
expect_output "training length 32"
expect_exit 0 "$SAMPLE" --checkpoint "$SCRATCH/rope" --device cpu -q --prompt "A" --max-new-tokens 60 \
  --set model.position.rope.scaling.kind=dynamic_ntk

# Bad input: flags named, exit 2; a prompt outside the vocabulary; a missing checkpoint exits 1.
expect_exit 2 "${S[@]}" --prompt "A" --top-p 0
expect_output "--top-p"
expect_exit 2 "${S[@]}" --prompt "A" --top-p 1.5
expect_output "--top-p"
expect_exit 2 "${S[@]}" --prompt "A" --temperature -1
expect_output "--temperature"
expect_exit 2 "${S[@]}" --prompt "A" --max-new-tokens 2000000
expect_output "--max-new-tokens"
expect_exit 2 "${S[@]}" --prompt "A" --num-samples 0
expect_exit 2 "${S[@]}" --prompt "A" --stop ""
expect_exit 2 "${S[@]}" --prompt ""
expect_output "empty"
expect_exit 2 "${S[@]}" --prompt "A" --prompt-file "$SCRATCH/tiny.json"
expect_exit 2 "${S[@]}" --prompt-file "$SCRATCH/no_such_prompt.txt"
expect_output "no_such_prompt.txt"
# Endless or blocking prompt sources are refused, not read forever (each case within 20 s).
mkfifo "$SCRATCH/prompt_fifo"
expect_exit 2 timeout 20 "${S[@]}" --prompt-file "$SCRATCH/prompt_fifo"
expect_output "is a FIFO"
expect_exit 2 timeout 20 "${S[@]}" --prompt-file /dev/zero
expect_output "is a character device"
set +e; timeout 20 "${S[@]}" </dev/zero >"$SCRATCH/out" 2>&1; code=$?; set -e
[ "$code" -eq 2 ] || { cat "$SCRATCH/out" >&2; fail "a prompt from /dev/zero on stdin exited $code, expected 2"; }
expect_output "longer than 16 MiB"
expect_exit 2 "${S[@]}" --prompt "hello world"
expect_output "outside the model's vocabulary"
expect_exit 2 "${S[@]}" --prompt "A" --set train.seq_len=64
expect_exit 2 "${S[@]}" --prompt "A" --json "$SCRATCH/no_such_dir/out.json"
expect_exit 1 "$SAMPLE" --checkpoint "$SCRATCH/missing_run" --prompt "A"
expect_output "missing_run"
# Samples during training (train.sample_every): logged and recorded; a prompt outside the
# vocabulary or a sample of data.kind indirect_indexing is refused before the first step.
expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/sampled" --set train.steps=4 \
  --set train.sample_every=2 --set train.sample_prompt=A --set train.sample_tokens=8
expect_output "step 2 | sample: A"
expect_output "step 4 | sample: A"
[ "$(grep -c '"event":"sample"' "$SCRATCH/sampled/metrics.jsonl")" -eq 2 ] || fail "two sample records expected"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/bad_prompt" --set train.sample_every=2 \
  --set "train.sample_prompt=hello world"
expect_output "train.sample_prompt"
[ ! -e "$SCRATCH/bad_prompt/checkpoints" ] || fail "a refused sample prompt still trained"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --out "$SCRATCH/rope_long" --set model.position.kind=rope \
  --set train.sample_every=2 --set train.sample_prompt=A --set train.sample_tokens=40
expect_output "train.sample_tokens"
echo "pope-sample CLI: all checks passed"
