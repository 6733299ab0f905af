#!/usr/bin/env bash
# pope-bench train end to end on the CPU with a tiny config: the table, the JSON numbers
# (FLOPs formula, step count, tokens per step), the profile, option and config errors, and
# --dump-step files for every encoding checked by the independent PyTorch oracle
# (scripts/reference/torch_gpt.py; PoPE also against the paper's equations, --pope-from-paper)
# when a python with torch is found (POPE_TORCH_PYTHON,
# python3, /usr/bin/python3); without one the oracle part prints "SKIP oracle: no torch" and
# the other checks still decide the result.
source "$(dirname "$0")/cli_common.sh"
BENCH="$POPE_BIN/pope-bench"
ORACLE="$POPE_SOURCE_DIR/scripts/reference/torch_gpt.py"
[ -x "$BENCH" ] || { echo "SKIP: $BENCH not built"; exit 77; }

# Vocabulary 61 padded to 64, so padded logits and rows are exercised; accumulation 2.
cat >"$SCRATCH/tiny.json" <<JSON
{
  "model": {"vocab_size": 61, "padded_vocab_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 32,
            "context_length": 16, "position": {"kind": "pope"}},
  "train": {"batch_size": 8, "micro_batch_size": 4, "seq_len": 16, "threads": 1, "device": "cpu"}
}
JSON

# Help names the subcommand and its options.
expect_exit 0 "$BENCH" --help
expect_output "train"
expect_exit 0 "$BENCH" train --help
for opt in --config --set --device --steps --warmup --data --profile --json --dump-step; do expect_output -- "$opt"; done

# The table.
expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 2 --warmup 1
for what in "tokens/s" "ms/step" "model TFLOP/s" "MFU vs 790" "FLOPs/token = 6·N + 12·n_layer·T·n_embd" \
  "4 sequences × 16 tokens × 2 accumulation = 128 tokens/step"; do
  expect_output "$what"
done

# --data: random windows of data.train (ids below 64, so the vocabulary is widened to 64).
make_tokens "$SCRATCH/train.bin" 4000 1
expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --data \
  --set data.train="$SCRATCH/train.bin" --set model.vocab_size=64
expect_output "tokens/step (data.train windows)"

# JSON: the numbers agree with each other and with the formula.
expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 3 --warmup 0 --json "$SCRATCH/rope.json" \
  --set model.position.kind=rope
expect_output "tokens/s"
python3 - "$SCRATCH/rope.json" <<'PY' || fail "JSON numbers inconsistent"
import json, math, sys
r = json.loads(open(sys.argv[1]).read())
problems = []
if len(r["step_seconds"]) != 3: problems.append(f"{len(r['step_seconds'])} step times, expected 3")
if r["tokens_per_step"] != 128: problems.append(f"tokens_per_step {r['tokens_per_step']}, expected 128")
# RoPE has no parameters of its own: N = embedding (61 real rows) + 2 layers × (2 gains + 12·C²) + final gain.
C, L, T = 32, 2, 16
N = 61 * C + L * (2 * C + 12 * C * C) + C
if r["parameters"] != N: problems.append(f"parameters {r['parameters']}, expected {N}")
if not math.isclose(r["flops_per_token"], 6 * N + 12 * L * T * C): problems.append("flops_per_token")
median = sorted(r["step_seconds"])[1]
if not math.isclose(r["tokens_per_second"], 128 / median, rel_tol=1e-9): problems.append("tokens/s != tokens/median step")
if r["mfu_vs_790"] is not None or r["device_memory_bytes"] is not None: problems.append("MFU/memory on the CPU")
if not (0 < r["forward_seconds"] and 0 < r["optimizer_seconds"]): problems.append("phase times")
if not (3.5 < r["last_loss"] < 5.0): problems.append(f"loss {r['last_loss']} is not near ln(61) = 4.11")
print("\n".join(problems) or "JSON ok")
sys.exit(1 if problems else 0)
PY

# The profile lists the op families and the matmul shapes (the last: the tied classifier, 64 rows × padded
# vocabulary 64; brackets escaped for grep).
expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --profile
for what in "Profile of one eager step" "| matmul |" "| attention_backward |" "| adamw |" "| cross_entropy |" \
  "out \\[64, 64\\] = a \\[64, 32\\] · bᵀ \\[64, 32\\]"; do
  expect_output "$what"
done
# On the CPU the profile names the host clock it reads, not the GPU's CUDA events.
expect_output "host time of each op, from the steady clock"
! grep -q "CUDA events" "$SCRATCH/out" || fail "the CPU profile speaks of CUDA events"

# Errors: exit 2 naming what is wrong.
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 0
expect_output "--steps: expected an integer from 1 to 2147483647, got 0"
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --warmup -2
expect_output "--warmup: expected an integer from 0 to 2147483647, got -2"
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --set model.bogus=1
expect_output "model.bogus"
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --data
expect_output "data.train"
expect_exit 2 "$BENCH" train --config "$SCRATCH/missing.json"
expect_output "missing.json"
expect_exit 2 "$BENCH"
# An output file that cannot be written is refused before anything runs.
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --json "$SCRATCH/no/such/dir/x.json"
expect_output "no/such/dir/x.json\" does not exist"
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --json "$SCRATCH"
expect_output "is a directory"
# A device is not replaced by a file (the writer renames its temporary file over the target).
expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --json /dev/null
expect_output "\"/dev/null\" is not a regular file"
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
expect_exit 1 "$BENCH" train --config "$SCRATCH/tiny.json" --data --set data.train="$SCRATCH/absent.bin"
expect_output "absent.bin"

# matmul: bad options exit 2 naming the flag; without a GPU (or one before sm_89) a clear exit 1.
expect_exit 0 "$BENCH" matmul --help
expect_output "FP8"
expect_exit 2 "$BENCH" matmul --config "$SCRATCH/tiny.json" --repeats 0
expect_output "--repeats"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 1 "$BENCH" matmul --config "$SCRATCH/tiny.json"
  expect_output "CUDA"
  expect_exit 2 "$BENCH" train --config "$SCRATCH/tiny.json" --steps 1 --warmup 0 --set train.precision=fp8
  expect_output "train.precision: expected bf16"
fi

# --dump-step: a readable safetensors file with weights, batch, loss, gradients and the config.
expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --dump-step "$SCRATCH/pope.safetensors" \
  --set model.position.pope.delta_init=uniform
python3 - "$SCRATCH/pope.safetensors" <<'PY' || fail "dump unreadable or incomplete"
import json, struct, sys
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n])
meta = header.pop("__metadata__")
assert meta["format"] == "pope-step-dump" and json.loads(meta["config"])["model"]["n_embd"] == 32, meta
assert header["tokens"]["dtype"] == "I32" and header["tokens"]["shape"] == [4, 16], header["tokens"]
assert header["targets"]["shape"] == [4, 16] and header["loss"]["shape"] == [], header["loss"]
for name in ["wte.weight", "layers.1.position.delta", "final_norm.weight"]:
    assert header[name]["dtype"] == "F32" and header["grad." + name]["shape"] == header[name]["shape"], name
b, e = header["loss"]["data_offsets"]
(loss,) = struct.unpack("<f", blob[8 + n + b:8 + n + e])
assert 3.0 < loss < 6.0, loss
print("dump ok, loss", loss)
PY

torch_python=""
for candidate in "${POPE_TORCH_PYTHON:-}" python3 /usr/bin/python3; do
  if [ -n "$candidate" ] && "$candidate" -c 'import torch' >/dev/null 2>&1; then torch_python="$candidate"; break; fi
done
if [ -z "$torch_python" ]; then
  echo "SKIP oracle: no torch"
  echo "PASS (without the PyTorch oracle)"
  exit 0
fi

# Every registered encoding at its defaults (pope-bench encodings), then options (scalings past the
# training length among them), against the oracle (CPU float dump: tight tolerances). The oracle
# exits 3 for a kind it does not implement (a kind newer than python/pope_hf/modeling_pope.py):
# reported as a skip of that kind, not a pass.
expect_exit 0 "$BENCH" encodings
kinds=$(cut -f1 "$SCRATCH/out")
for kind in nope rope pope alibi xpos t5_bias; do grep -qx "$kind" <<<"$kinds" || fail "pope-bench encodings lacks $kind"; done
variants=()
for kind in $kinds; do variants+=("$kind|--set model.position.kind=$kind --set model.n_head=4"); done
variants+=(
  "rope_half|--set model.position.kind=rope --set model.position.rope.fraction=0.5"
  "pope_uniform_delta|--set model.position.pope.delta_init=uniform"
  "pope_ablation|--set model.position.pope.magnitude=identity --set model.position.pope.scale=inv_sqrt_2d"
  "pope_no_delta|--set model.position.pope.learn_delta=false --set model.position.pope.magnitude=relu"
  "alibi_half|--set model.position.kind=alibi --set model.n_head=4 --set model.position.alibi.head_fraction=0.5"
  "alibi_6_of_8|--set model.position.kind=alibi --set model.n_head=8 --set model.position.alibi.head_fraction=0.75"
  "rope_yarn_4|--set model.position.kind=rope_yarn --set model.position.rope.scaling.factor=4 --set train.seq_len=32"
  "rope_dynamic_ntk|--set model.position.kind=rope --set model.position.rope.scaling.kind=dynamic_ntk --set train.seq_len=40"
  "rope_ntk_half|--set model.position.kind=rope_ntk --set model.position.rope.scaling.factor=3 --set model.position.rope.fraction=0.5"
  "full_k1_lightcone|--set model.position.kind=full --set model.position.pj.order=1 --set model.position.pj.rho=lightcone --set train.seq_len=40"
  "pj_rotary_k3|--set model.position.kind=pj_rotary --set model.position.pj.rotary_order=3 --set model.position.pj.rotary_base=100"
  "t5_bias_9_buckets|--set model.position.kind=t5_bias --set model.position.t5_bias.buckets=9 --set model.position.t5_bias.max_distance=12 --set train.seq_len=40"
  "xpos_fast_decay|--set model.position.kind=xpos --set model.position.xpos.scale_base=8 --set train.seq_len=40"
)
for variant in "${variants[@]}"; do
  name="${variant%%|*}"
  read -r -a sets <<<"${variant#*|}"
  expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --dump-step "$SCRATCH/$name.safetensors" "${sets[@]}"
  set +e
  "$torch_python" "$ORACLE" "$SCRATCH/$name.safetensors" >"$SCRATCH/out" 2>&1
  code=$?
  set -e
  if [ "$code" = 3 ]; then
    echo "SKIP oracle $name: $(cat "$SCRATCH/out")"
    continue
  fi
  [ "$code" = 0 ] || { cat "$SCRATCH/out"; fail "oracle $name exited $code"; }
  expect_output "OK: loss and"
  echo "oracle $name: $(grep '^loss:' "$SCRATCH/out")"
done

# The oracle fails when pope's numbers are wrong: scale one gradient in the file by 1.01.
tamper() {  # DUMP TENSOR OUT: OUT is DUMP with the f32 TENSOR scaled by 1.01
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
blob = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack("<Q", blob[:8])
b, e = json.loads(blob[8:8 + n])[sys.argv[2]]["data_offsets"]
start = 8 + n
values = struct.unpack(f"<{(e - b) // 4}f", blob[start + b:start + e])
blob[start + b:start + e] = struct.pack(f"<{len(values)}f", *(v * 1.01 for v in values))
open(sys.argv[3], "wb").write(blob)
PY
}
tamper "$SCRATCH/pope.safetensors" grad.layers.0.mlp.fc.weight "$SCRATCH/tampered.safetensors"
expect_exit 1 "$torch_python" "$ORACLE" "$SCRATCH/tampered.safetensors"
expect_output "MISMATCH: grad.layers.0.mlp.fc.weight"

# PoPE against the paper's equations written out in complex arithmetic (--pope-from-paper: no code
# shared with modeling_pope.py's encoding), for each δ bound and both softmax scales; a δ gradient
# scaled by 1.01 must fail it.
# The dumps jitter δ around its zero init, so about half of it lies past 0: clamped or not.
for variant in "clamp|--set model.position.pope.delta_bound=clamp" \
  "clamp_uniform|--set model.position.pope.delta_init=uniform" \
  "none|--set model.position.pope.delta_bound=none" \
  "project_2d|--set model.position.pope.delta_bound=project --set model.position.pope.scale=inv_sqrt_2d"; do
  name="paper_${variant%%|*}"
  read -r -a sets <<<"${variant#*|}"
  expect_exit 0 "$BENCH" train --config "$SCRATCH/tiny.json" --dump-step "$SCRATCH/$name.safetensors" "${sets[@]}"
  expect_exit 0 "$torch_python" "$ORACLE" "$SCRATCH/$name.safetensors" --pope-from-paper
  expect_output "OK: loss and"
  echo "oracle $name: $(grep '^loss:' "$SCRATCH/out")"
done
tamper "$SCRATCH/paper_clamp.safetensors" grad.layers.0.position.delta "$SCRATCH/tampered_delta.safetensors"
expect_exit 1 "$torch_python" "$ORACLE" "$SCRATCH/tampered_delta.safetensors" --pope-from-paper
expect_output "MISMATCH: grad.layers.0.position.delta"
# A dump of another encoding is not the paper's PoPE: reported as not implemented (3).
expect_exit 3 "$torch_python" "$ORACLE" "$SCRATCH/rope_half.safetensors" --pope-from-paper

# And refuses what is not a dump.
printf 'not a dump' >"$SCRATCH/junk.safetensors"
expect_exit 2 "$torch_python" "$ORACLE" "$SCRATCH/junk.safetensors"
echo "PASS"
