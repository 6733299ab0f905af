#!/usr/bin/env python3
"""Writes a HellaSwag-shaped jsonl of made-up text, to time `pope-eval --task hellaswag` without
the dataset (its validation split is 10,042 examples × 4 endings).

  python3 scripts/synthetic_hellaswag.py OUT.jsonl [--examples 10042] [--seed 1]

Each record has the official fields (activity_label, ctx_a, ctx_b, ctx, endings[4], label) with
lengths near the real split's: contexts of 20–70 words, endings of 8–30 words. The words are
drawn from a small fixed list, so the scores mean nothing; only the amount of work is real.
"""
import argparse
import json
import random

WORDS = (
    "the a man woman person people boy girl dog ball water car house road table chair door window "
    "is are was then now after before while and but so with without into onto over under near far "
    "takes puts holds walks runs jumps turns looks shows begins continues stops finishes cleans paints "
    "small large red blue old new quickly slowly carefully again together outside inside around "
    "kitchen garden field river street camera knife brush rope bicycle guitar paper box bottle"
).split()


def sentence(rng, low, high):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) + "."


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--examples", type=int, default=10042)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for i in range(args.examples):
            ctx_a = sentence(rng, 15, 55)
            ctx_b = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
            record = {
                "ind": i,
                "activity_label": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))),
                "ctx_a": ctx_a,
                "ctx_b": ctx_b,
                "ctx": ctx_a + " " + ctx_b,
                "split": "val",
                "split_type": "synthetic",
                "endings": [sentence(rng, 8, 30) for _ in range(4)],
                "label": rng.randrange(4),
                "source_id": f"synthetic-{i}",
            }
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
