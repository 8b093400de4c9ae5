#!/usr/bin/env python3
"""Writes data/train/distill_prompts.jsonl.gz: about 20K permissively licensed training prompts
for self-distilling drafters at scale (`paradraft train dflash --prompts ...`), already in the
form the user turn takes (GSM8K gets the step-by-step suffix of the GSM8K/MATH-500 benchmarks).
Run from the repository root with ../shared beside it:  python3 scripts/vendor_distill_prompts.py

Sources (see data/README.md): GSM8K train (MIT), GPTeacher codegen and roleplay (MIT), the MBPP
non-test splits (CC BY 4.0), and first user turns of ShareGPT conversations (Apache-2.0 as
declared by the dataset card; weaker provenance, see shared/data/README.md). No CC BY-NC source
(Alpaca, CodeAlpaca) and no benchmark prompt is used."""
import gzip, json, os, random, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vendor_train_prompts import gpteacher, gsm8k_train  # noqa: E402

SHARED = "../shared/data"
rows = gsm8k_train() + gpteacher()
with open(f"{SHARED}/bench/mbpp.jsonl") as f:
    for line in f:
        r = json.loads(line)
        if r["split"] != "test":
            rows.append({"id": r["id"], "source": "mbpp_nontest", "category": "code",
                         "prompt": r["turns"][0]})
share = []
with gzip.open(f"{SHARED}/train/prompt_pool.jsonl.gz", "rt") as f:
    for line in f:
        r = json.loads(line)
        if r["source"] == "sharegpt":
            t = r["turns"][0].strip()
            if 20 <= len(t) <= 1500:
                share.append({"id": r["id"], "source": "sharegpt", "category": "chat",
                              "prompt": t})
rng = random.Random(0)
rng.shuffle(share)
rows += share[:6000]
rng.shuffle(rows)
with gzip.GzipFile("data/train/distill_prompts.jsonl.gz", "wb", mtime=0) as f:
    for r in rows:
        f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
by = {}
for r in rows:
    by[r["source"]] = by.get(r["source"], 0) + 1
print(len(rows), "prompts", by)
