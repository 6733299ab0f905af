#!/usr/bin/env bash
# pope-train with the PJ-RoPE methods: bad model.position.pj.* options exit 2 naming the key;
# `pjrope` (= full), `rope_affine` and `pj_rotary` train a small model whose validation loss
# falls, and the PJ-bias parameters land in the checkpoint under layers.<i>.position.*.
source "$(dirname "$0")/cli_common.sh"
TRAIN="$POPE_BIN/pope-train"
[ -x "$TRAIN" ] || { echo "SKIP: $TRAIN not built"; exit 77; }

make_tokens "$SCRATCH/train.bin" 40000 1
make_tokens "$SCRATCH/val.bin" 8000 2
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 64, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 32, "position": {"kind": "pjrope"}},
  "data": {"train": "$SCRATCH/train.bin", "val": "$SCRATCH/val.bin"},
  "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5},
  "train": {"steps": 40, "batch_size": 16, "micro_batch_size": 8, "seq_len": 32, "log_every": 10,
            "eval_every": 40, "eval_batches": 4, "checkpoint_every": 40, "threads": 1, "device": "cpu"}
}
JSON

expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.pj.rho=cubic --dry-run
expect_output "model.position.pj.rho"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.pj.order=16 --dry-run
expect_output "model.position.pj.order"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=pj_rotary \
  --set model.position.pj.rotary_order=2 --dry-run
expect_output "model.position.pj.rotary_order"
expect_exit 2 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=rope_ntk \
  --set model.position.rope.scaling.kind=yarn --dry-run
expect_output "model.position.rope.scaling.kind"

for kind in pjrope rope_affine pj_rotary; do
  expect_exit 0 "$TRAIN" --config "$SCRATCH/tiny.json" --set model.position.kind=$kind --out "$SCRATCH/$kind" -q
  python3 - "$SCRATCH/$kind" "$kind" <<'PY' || fail "$kind: see above"
import json, struct, sys
run, kind = sys.argv[1], sys.argv[2]
evals = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"eval"' in l]
first, last = evals[0]["val_loss"], evals[-1]["val_loss"]
assert last < first - 0.5, f"{kind}: validation loss {first} -> {last} did not fall"
with open(f"{run}/checkpoints/step_00000040/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
has_bias = "layers.1.position.omega" in header
assert has_bias == (kind != "pj_rotary"), f"{kind}: PJ-bias parameters present: {has_bias}"
if has_bias:
    assert header["layers.1.position.lc_im"]["shape"] == [2, 4], header["layers.1.position.lc_im"]
PY
done
# pope-eval --diagnostics: gates, orders and energies per layer and head, and with --data the
# leave-one-out ΔNLL; a checkpoint without a PJ-bias is refused.
EVAL="$POPE_BIN/pope-eval"
if [ -x "$EVAL" ]; then
  expect_exit 0 "$EVAL" --diagnostics --checkpoint "$SCRATCH/pjrope" --data "$SCRATCH/val.bin" --max-windows 16 \
    --device cpu --json "$SCRATCH/diag.json"
  python3 - "$SCRATCH/diag.json" <<'PY' || fail "pope-eval --diagnostics JSON: see above"
import json, sys
j = json.load(open(sys.argv[1]))
text = json.dumps(j)
assert len(j["layers"]) == 2, list(j)
assert "ablations" in j and j["ablations"], "no ablations with --data"
assert "gate" in text or "gates" in text, "no gates in the report"
PY
  expect_exit 1 "$EVAL" --diagnostics --checkpoint "$SCRATCH/pj_rotary" --device cpu
fi
echo "ok"
