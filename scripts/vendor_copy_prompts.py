#!/usr/bin/env python3
"""Writes data/bench/alpaca_copy.jsonl: a copy-heavy benchmark set (the answer reuses much of the
prompt's text) for prompt lookup and `auto` drafting. The first 40 Stanford Alpaca records after
the 200 of alpaca_200.jsonl whose instruction asks to rewrite, edit, summarise, extract, correct,
paraphrase, convert or reformat a given input of at least 250 characters.

Usage: python3 scripts/vendor_copy_prompts.py SHARED_DATA_DIR   (the project's shared data)
"""
import gzip
import json
import re
import sys

KEYWORDS = re.compile(
    r"\b(rewrite|edit|summari[sz]e|extract|correct|paraphrase|rephrase|convert|reformat|"
    r"proofread|revise)\b",
    re.I,
)


def main(shared):
    out = []
    with gzip.open(f"{shared}/train/alpaca_52k.jsonl.gz", "rt") as f:
        for i, line in enumerate(f):
            if i < 200:
                continue
            v = json.loads(line)
            if len(v.get("input") or "") >= 250 and KEYWORDS.search(v["instruction"]):
                out.append({k: v[k] for k in ("id", "category", "turns", "instruction", "input")})
            if len(out) == 40:
                break
    with open("data/bench/alpaca_copy.jsonl", "w") as f:
        for v in out:
            f.write(json.dumps(v) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
