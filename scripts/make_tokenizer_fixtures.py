#!/usr/bin/env python3
"""Writes the SentencePiece tokenizer fixtures: token ids from llama.cpp's `llama-tokenize` for a
few hundred strings on three GGUF vocabularies. Run once by hand; the tests only read what it
wrote (llama.cpp is a fixture tool, never a dependency).

    python3 scripts/make_tokenizer_fixtures.py --llama PATH/llama.cpp

PATH/llama.cpp is the source tree of the `llama-cpp-python` sdist (vendor/llama.cpp) with its
tools built under build/bin (see scripts/quant/parity.py). Outputs under fixtures/tokenizers/:

  llama-spm.gguf   llama.cpp's own test vocabulary of Llama 2 (models/ggml-vocab-llama-spm.gguf):
                   32,000 SentencePiece tokens with scores, byte fallback, BOS added
  phi-3.gguf       Phi-3's (models/ggml-vocab-phi-3.gguf): 32,064 tokens, chat tokens such as
                   <|user|> and <|end|>, whose trailing whitespace llama.cpp strips
  spm_ids.json     the strings, and for each vocabulary (and Llama 2's with the space prefix
                   turned off, as Gemma files have it) the ids llama-tokenize gives them with
                   special tokens parsed and the model's BOS rule
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "fixtures", "tokenizers")


def strings(inp_path):
    """llama.cpp's own test strings, hand-written edge cases, and prompts of the bench sets."""
    out = []
    with open(inp_path, encoding="utf-8") as f:
        out += [s for s in f.read().split("\n__ggml_vocab_test__\n") if s]
    spaces = [" " * n for n in range(1, 9)] + ["\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n \n"]
    out += spaces
    out += [f"a{w}b" for w in spaces] + [f"{w}x{w}" for w in spaces]
    out += [
        "Hello world",
        "  leading spaces and trailing   ",
        "Numbers: 12345 and 3.14159, year 2026!",
        "def f(x):\n    return x ** 2  # square\n",
        "Unicode: café, naïve, 東京, emoji 🙂",
        "tabs\tand\nnewlines\n\n\nend",
        "1 22 333 4444 55555 666666 7777777 88888888",
        "0.5 -17 +3e-9 1,000,000 0x1F 0b1010",
        "I'm, you're, it's, they've, we'll, she'd",
        "ALL CAPS and MiXeD CaSe and lowercase",
        "URL: https://example.com/path?q=1&r=two#frag",
        "email: someone@example.org",
        "{\"json\": [1, 2, {\"k\": null}], \"b\": true}",
        "SELECT * FROM t WHERE x > 3 ORDER BY y;",
        "for (int i = 0; i < n; ++i) { s += a[i]; }",
        "    indented\n        twice\n\tand a tab",
        "Zero\u200bwidth and non\u00a0breaking",
        "Combining: e\u0301 a\u0308 n\u0303",
        "Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย",
        "한국어 문장과 日本語の文と中文句子",
        "Rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 ☃ ♞ ⚙ 🧬🦙🫠",
        "Family: 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
        "▁already▁escaped▁ and ▁▁",
        "<0x41> is not a byte token in text",
        "<s> starts, </s> ends, <unk> unknown",
        "text<s>glued</s>text",
        "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
        "<|system|> You are helpful.<|end|>   \n<|user|>hi<|end|>",
        "<|endoftext|> after <|endoftext|>",
        "a<|end|>b<|end|> c <|end|>\n\nd",
        "<|placeholder1|><|placeholder2|>",
        "[INST] Hello [/INST] Hi</s>[INST] again [/INST]",
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        "",
        " ",
        "x",
        "!!!???...,,,;;;:::",
        "———––-- ...… «quotes» “curly” ‘single’",
        "Ā ā Ă ă Ą ą Ć ć Ĉ ĉ",
        "\u0000 nul \u0001 soh \u007f del",
        "\U0001F600" * 5,
        "a" * 40,
        "ab " * 30,
    ]
    rng = random.Random(7)
    bench = os.path.join(ROOT, "data", "bench")
    prompts = []
    for name in sorted(os.listdir(bench)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(bench, name), encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                text = row.get("prompt") or row.get("question") or row.get("instruction")
                if text is None and row.get("turns"):
                    text = row["turns"][0]
                if isinstance(text, str) and text.strip():
                    prompts.append(text[:400])
    rng.shuffle(prompts)
    out += prompts[:180]
    # Random runs of characters from mixed scripts, whitespace and punctuation.
    alphabet = "ab cd\tEF\n12 .,!?-_é漢🙂ßØ\u00a0ж"
    out += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(40)]
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def no_space_prefix_copy(src, dst):
    """A copy of a vocabulary GGUF with tokenizer.ggml.add_space_prefix = false."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(tool, gguf_path, text, tmp):
    p = os.path.join(tmp, "in.txt")
    with open(p, "wb") as f:
        f.write(text.encode("utf-8"))
    out = subprocess.run(
        [tool, "-m", gguf_path, "-f", p, "--ids", "--log-disable", "--no-escape"],
        capture_output=True, check=True,
    ).stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama", required=True, help="llama.cpp source tree with build/bin")
    a = ap.parse_args()
    tool = os.path.join(a.llama, "build", "bin", "llama-tokenize")
    models = os.path.join(a.llama, "models")
    os.makedirs(OUT, exist_ok=True)
    for name in ["llama-spm", "phi-3"]:
        shutil.copyfile(os.path.join(models, f"ggml-vocab-{name}.gguf"), os.path.join(OUT, f"{name}.gguf"))
    texts = strings(os.path.join(models, "ggml-vocab-llama-spm.gguf.inp"))
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        nsp = os.path.join(tmp, "llama-spm-no-prefix.gguf")
        no_space_prefix_copy(os.path.join(OUT, "llama-spm.gguf"), nsp)
        for case, path in [
            ("llama-spm", os.path.join(OUT, "llama-spm.gguf")),
            ("phi-3", os.path.join(OUT, "phi-3.gguf")),
            ("llama-spm-no-prefix", nsp),
        ]:
            cases[case] = [tokenize(tool, path, t, tmp) for t in texts]
            print(case, len(texts), "strings")
    with open(os.path.join(OUT, "spm_ids.json"), "w", encoding="utf-8") as f:
        json.dump({"tool": "llama-tokenize (llama-cpp-python 0.3.36 sdist), -f FILE --ids --no-escape",
                   "strings": texts, "ids": cases}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
