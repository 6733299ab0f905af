#!/usr/bin/env python3
"""Compares two pope-train run directories: the per-step training losses (metrics.jsonl) and
the weights of their newest checkpoints (model.safetensors). Used by multi_gpu_check.sh to
check that a data-parallel run follows a one-GPU run at the same global batch.

Usage: compare_runs.py RUN_A RUN_B [--max-loss-diff X] [--max-weight-diff Y]
Prints one summary line; exits 1 when a difference exceeds its limit, 2 on unreadable input."""
import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "BF16": None, "I32": np.int32, "U16": np.uint16}


def train_losses(run: Path) -> dict:
    losses = {}
    with open(run / "metrics.jsonl") as f:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "train":
                losses[record["step"]] = record["loss"]
    return losses


def newest_checkpoint(run: Path) -> Path:
    steps = sorted((run / "checkpoints").glob("step_*"))
    if not steps:
        raise FileNotFoundError(f"{run}/checkpoints holds no step directory")
    return steps[-1]


def read_safetensors(path: Path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[8 + length + begin : 8 + length + end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            values = bits.view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--max-loss-diff", type=float, default=0.05)
    parser.add_argument("--max-weight-diff", type=float, default=0.05)
    args = parser.parse_args()
    try:
        a, b = train_losses(args.run_a), train_losses(args.run_b)
        weights_a = read_safetensors(newest_checkpoint(args.run_a) / "model.safetensors")
        weights_b = read_safetensors(newest_checkpoint(args.run_b) / "model.safetensors")
    except (OSError, ValueError, KeyError) as e:
        print(f"compare_runs: cannot read the runs: {e}", file=sys.stderr)
        return 2
    if sorted(a) != sorted(b) or not a:
        print(f"compare_runs: logged steps differ: {sorted(a)} vs {sorted(b)}", file=sys.stderr)
        return 1
    if sorted(weights_a) != sorted(weights_b):
        print("compare_runs: the checkpoints hold different tensors", file=sys.stderr)
        return 1
    loss_diff = max(abs(a[s] - b[s]) for s in a)
    worst_step = max(a, key=lambda s: abs(a[s] - b[s]))
    weight_diff = max(float(np.max(np.abs(weights_a[n] - weights_b[n]))) for n in weights_a)
    ok = loss_diff <= args.max_loss_diff and weight_diff <= args.max_weight_diff
    print(
        f"{len(a)} steps, max |loss diff| {loss_diff:.2e} (step {worst_step}, limit {args.max_loss_diff}), "
        f"max |weight diff| {weight_diff:.2e} (limit {args.max_weight_diff}), "
        f"final losses {a[max(a)]:.4f} / {b[max(b)]:.4f}: {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
