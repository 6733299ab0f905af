#!/usr/bin/env python3
"""The attention targets of issues 5 and 6 as one Markdown table.

Reads the JSON of one or more `pope-bench attention` runs (a round's rows may come in one file or in
one file per encoding; `--impl both` adds cuDNN's rows)
and, optionally, PyTorch SDPA's (scripts/reference/attention_sdpa_bench.py --json). Prints the
median forward+backward ms per encoding, implementation and T over the rounds (with the range
when there are several), then the ratios the targets are stated in, each from the medians.

Usage: scripts/attention_table.py [--sdpa SDPA.json] ROUND.json [ROUND.json ...]
"""
import argparse
import json
import statistics
import sys

# (label, numerator, denominator, target): (encoding, impl) pairs; "sdpa" rows are PyTorch's
# cuDNN at the numerator's q/k width.
RATIOS = [
    ("RoPE / cuDNN", ("rope", "fused"), ("rope", "cudnn"), "≤ 1.10"),
    ("PoPE / cuDNN (128-wide q/k)", ("pope", "fused"), ("pope", "cudnn"), "< 1"),
    ("RoPE / PyTorch cuDNN", ("rope", "fused"), ("rope", "sdpa"), "≤ 1.10"),
    ("PoPE / PyTorch cuDNN (128-wide q/k)", ("pope", "fused"), ("pope", "sdpa"), "< 1"),
    ("PoPE / RoPE", ("pope", "fused"), ("rope", "fused"), "≤ 1.15"),
    ("ALiBi / NoPE", ("alibi", "fused"), ("nope", "fused"), "≤ 1.10"),
    ("`full` / NoPE", ("full", "fused"), ("nope", "fused"), "≤ 1.10"),
    ("PJ-rotary / NoPE", ("pj_rotary", "fused"), ("nope", "fused"), ""),
    ("xPos / RoPE", ("xpos", "fused"), ("rope", "fused"), "≤ 1.05"),
    ("T5 bias / NoPE", ("t5_bias", "fused"), ("nope", "fused"), "≤ 1.12"),
]


def load_rows(path, what):
    try:
        with open(path) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"attention_table.py: {what} {path}: not a benchmark JSON with rows ({error})")
    for row in rows:
        missing = {"seq_len", "forward_backward_ms", "qk_width"} - set(row)
        if missing:
            sys.exit(f"attention_table.py: {what} {path}: a row lacks {', '.join(sorted(missing))}")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rounds", nargs="+", help="pope-bench attention --json files, one or more per round")
    parser.add_argument("--sdpa", help="scripts/reference/attention_sdpa_bench.py --json file")
    args = parser.parse_args()

    values = {}  # (encoding, impl, T) → f+b ms of each round
    for path in args.rounds:
        for row in load_rows(path, "round"):
            key = (row.get("encoding"), row.get("impl", "fused"), row["seq_len"])
            values.setdefault(key, []).append(row["forward_backward_ms"])
    if args.sdpa:
        # PyTorch's rows are per q/k width: 64 is RoPE's and NoPE's, 128 PoPE's.
        for row in load_rows(args.sdpa, "--sdpa"):
            for encoding in {64: ("rope", "nope"), 128: ("pope",)}.get(row["qk_width"], ()):
                values.setdefault((encoding, "sdpa", row["seq_len"]), []).append(row["forward_backward_ms"])
    if not values:
        sys.exit("attention_table.py: the rounds hold no rows")
    median = {key: statistics.median(v) for key, v in values.items()}
    lengths = sorted({T for _, _, T in values})

    rounds = max(len(v) for v in values.values())  # a round may span several files (one per encoding)
    print(f"\n| f+b ms, median of {rounds} round(s) | " + " | ".join(f"T = {T}" for T in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for encoding, impl in sorted({(e, i) for e, i, _ in values}):
        cells = []
        for T in lengths:
            v = values.get((encoding, impl, T))
            if not v:
                cells.append("–")
            elif len(v) > 1:
                cells.append(f"{median[(encoding, impl, T)]:.3f} ({min(v):.3f}–{max(v):.3f})")
            else:
                cells.append(f"{v[0]:.3f}")
        print(f"| {encoding} ({impl}) | " + " | ".join(cells) + " |")

    print("\n| ratio (target) | " + " | ".join(f"T = {T}" for T in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for label, top, bottom, target in RATIOS:
        cells = [f"{median[top + (T,)] / median[bottom + (T,)]:.3f}"
                 if top + (T,) in median and bottom + (T,) in median else "–" for T in lengths]
        if any(c != "–" for c in cells):
            print(f"| {label}{f' ({target})' if target else ''} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
