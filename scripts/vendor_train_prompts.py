#!/usr/bin/env python3
"""Writes data/train/dflash_prompts.jsonl: the permissively licensed (MIT) training prompts the
first DFlash self-distillation used, already in the form the user turn takes (GSM8K gets the same
step-by-step suffix as the GSM8K/MATH-500 benchmarks). Run from the repository root with
../shared beside it:  python3 scripts/vendor_train_prompts.py
Sources (see data/README.md): GSM8K train (MIT), GPTeacher codegen and roleplay (MIT).
`scripts/vendor_distill_prompts.py` reuses the readers below for the larger set."""
import gzip, json, random

SHARED = "../shared/data/train"
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def gsm8k_train():
    with gzip.open(f"{SHARED}/gsm8k_train.jsonl.gz", "rt") as f:
        return [{"id": r["id"], "source": "gsm8k_train", "category": "math",
                 "prompt": r["turns"][0] + BOXED} for r in map(json.loads, f)]


def gpteacher(subsets=("codegen", "roleplay")):
    with gzip.open(f"{SHARED}/gpteacher.jsonl.gz", "rt") as f:
        return [{"id": r["id"], "source": "gpteacher", "category": r["category"],
                 "prompt": r["turns"][0]} for r in map(json.loads, f) if r["subset"] in subsets]


if __name__ == "__main__":
    rows = gsm8k_train() + gpteacher()
    rng = random.Random(0)
    by = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r)
    # Equal parts math and code, a smaller part chat; then shuffled together.
    take = {"math": 1600, "code": 1600, "chat": 800}
    out = []
    for cat, n in take.items():
        pool = by[cat]
        rng.shuffle(pool)
        out += pool[:n]
    rng.shuffle(out)
    with open("data/train/dflash_prompts.jsonl", "w") as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(len(out), "prompts")
