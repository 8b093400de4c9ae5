#!/usr/bin/env python3
"""Writes paradraft's reference fixtures. Run once by hand; CI only reads what it wrote.

    python3 -m venv .venv-ref && .venv-ref/bin/pip install torch transformers accelerate gguf numpy safetensors tokenizers
    .venv-ref/bin/python scripts/make_fixtures.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf [--llama-tokenize PATH]

Outputs (under fixtures/):
  smollm2_reference.json   top-20 logits at every position for chat-templated prompts, computed by
                           HF transformers from the GGUF dequantised to f32; the rendered chat
                           template; token ids of test strings (from llama.cpp's llama-tokenize when
                           given, which is the reference tokenizer for GGUF files).
  tiny/{llama,qwen2,qwen3}/ random-weight HF models (safetensors F32 / F16 / BF16, a trained byte-level
                           BPE tokenizer, a ChatML template) with reference.safetensors: input ids,
                           full logits and every layer's output from transformers in float32.
  tiny/llama-quant.gguf    the tiny Llama written as GGUF with Q4_0/Q4_1/Q8_0/F16/BF16/F32 tensors,
                           with tiny/llama-quant.reference.safetensors: logits of the same model in
                           transformers with the dequantised weights.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors.numpy import save_file as save_np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIX = os.path.join(ROOT, "fixtures")

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant that answers in one sentence."},
        {"role": "user", "content": "Explain why the sky is blue."},
    ],
    [
        {
            "role": "user",
            "content": (
                "Write a Python function that takes a list of integers and returns the length of the "
                "longest strictly increasing subsequence. Explain the dynamic programming recurrence, "
                "give the time and memory complexity, and then show how to improve it to O(n log n) "
                "with patience sorting. Finally, test it on [10, 9, 2, 5, 3, 7, 101, 18] and on an "
                "empty list, and describe what the function returns in each case and why."
            ),
        }
    ],
    [
        {"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"},
    ],
]

TOKENIZE_STRINGS = [
    "Hello world",
    "  leading spaces and trailing   ",
    "Numbers: 12345 and 3.14159, year 2026!",
    "def f(x):\n    return x ** 2  # square\n",
    "Unicode: café, naïve, 東京, emoji 🙂",
    "<|im_start|>user\nhi<|im_end|>\n",
    "tabs\tand\nnewlines\n\n\nend",
]


def top_k(logits, k=20):
    vals, idx = torch.topk(logits, k, dim=-1)
    return [[[int(i), float(v)] for i, v in zip(ii, vv)] for ii, vv in zip(idx.tolist(), vals.tolist())]


def smollm2(gguf_path, llama_tokenize):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    model.eval()
    prompts = []
    for msgs in CHAT_PROMPTS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = ids_for(text, tok, gguf_path, llama_tokenize)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        prompts.append({"messages": msgs, "text": text, "token_ids": ids, "top": top_k(logits)})
        print(f"smollm2: prompt of {len(ids)} tokens", file=sys.stderr)
    strings = [{"text": s, "token_ids": ids_for(s, tok, gguf_path, llama_tokenize)} for s in TOKENIZE_STRINGS]
    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "reference": "transformers %s (GGUF dequantised to f32), torch %s" % (
            __import__("transformers").__version__, torch.__version__),
        "tokenizer_reference": "llama.cpp llama-tokenize" if llama_tokenize else "transformers GGUF tokenizer",
        "prompts": prompts,
        "tokenize": strings,
    }
    with open(os.path.join(FIX, "smollm2_reference.json"), "w") as fh:
        json.dump(out, fh)


def ids_for(text, tok, gguf_path, llama_tokenize):
    if not llama_tokenize:
        return tok(text, add_special_tokens=False)["input_ids"]
    # llama-tokenize parses special tokens by default; stdin + --no-escape keeps the text verbatim.
    r = subprocess.run(
        [llama_tokenize, "-m", gguf_path, "--stdin", "--ids", "--log-disable", "--no-bos", "--no-escape"],
        input=text, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def tiny_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [s for msgs in CHAT_PROMPTS for m in msgs for s in [m["content"]]] + TOKENIZE_STRINGS
    tk.train_from_iterator(corpus * 4, trainer)
    tk.save(os.path.join(out_dir, "tokenizer.json"))
    template = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False,
                   "chat_template": template, "model_max_length": 256,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, fh, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 0, "eos_token_id": [2, 0]}, fh)
    return tk


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.12 * torch.randn(p.shape, generator=g))


def tiny_models():
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=2)
    specs = [
        ("llama", LlamaForCausalLM, LlamaConfig(**common, rms_norm_eps=1e-5, rope_theta=10000.0,
                                                 tie_word_embeddings=False,
                                                 rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                               "original_max_position_embeddings": 64}),
         torch.float32),
        ("qwen2", Qwen2ForCausalLM, Qwen2Config(**common, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                                 tie_word_embeddings=True), torch.float16),
        ("qwen3", Qwen3ForCausalLM, Qwen3Config(**common, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                                 tie_word_embeddings=True, attention_bias=False), torch.bfloat16),
    ]
    ids = None
    for i, (name, cls, cfg, dtype) in enumerate(specs):
        out = os.path.join(FIX, "tiny", name)
        os.makedirs(out, exist_ok=True)
        tk = tiny_tokenizer(out)
        torch.manual_seed(i)
        model = cls(cfg)
        randomise(model, 100 + i)
        model = model.to(dtype)
        model.save_pretrained(out, safe_serialization=True)
        if name == "llama":
            legacy_rope_config(os.path.join(out, "config.json"))
        # The reference runs the saved (possibly rounded) weights in float32.
        ref = cls.from_pretrained(out, torch_dtype=torch.float32).eval()
        text = "<|im_start|>user\nExplain why the sky is blue, with numbers 12345.<|im_end|>\n<|im_start|>assistant\n"
        ids = tk.encode(text).ids
        with torch.no_grad():
            o = ref(torch.tensor([ids]), output_hidden_states=True)
        hidden = torch.stack([h[0] for h in o.hidden_states[1:]])  # layer outputs (last one is normed)
        save_np({"input_ids": np.array(ids, dtype=np.int64),
                 "logits": o.logits[0].numpy().astype(np.float32),
                 "hidden": hidden.numpy().astype(np.float32)},
                os.path.join(out, "reference.safetensors"))
        with open(os.path.join(out, "reference_text.json"), "w") as fh:
            json.dump({"text": text, "token_ids": ids}, fh)
        print(f"tiny {name}: {len(ids)} tokens", file=sys.stderr)


def legacy_rope_config(path):
    """Rewrites `rope_parameters` (transformers 5) as `rope_theta` + `rope_scaling` (the form most
    published checkpoints use), so the fixtures cover both spellings."""
    c = json.load(open(path))
    rp = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    json.dump(c, open(path, "w"), indent=2)


def rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))


def permute_qk(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_gguf():
    """The tiny Llama as a GGUF with one tensor type per projection, and its reference logits."""
    import gguf
    from gguf.quants import dequantize, quantize
    from transformers import LlamaForCausalLM

    Q = gguf.GGMLQuantizationType
    src = os.path.join(FIX, "tiny", "llama")
    model = LlamaForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
    cfg = model.config
    types = {"q_proj": Q.Q4_0, "k_proj": Q.Q4_1, "v_proj": Q.Q8_0, "o_proj": Q.F16,
             "gate_proj": Q.BF16, "up_proj": Q.Q4_1, "down_proj": Q.Q8_0}
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    w = gguf.GGUFWriter(os.path.join(FIX, "tiny", "llama-quant.gguf"), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(rope_theta(cfg))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    tj = json.load(open(os.path.join(src, "tokenizer.json")))
    vocab = tj["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    for a in tj["added_tokens"]:
        tokens[a["id"]] = a["content"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    tc = json.load(open(os.path.join(src, "tokenizer_config.json")))
    w.add_chat_template(tc["chat_template"])
    # llama3 rope scaling is carried as per-frequency divisors, as llama.cpp's converter writes it.
    inv = model.model.rotary_emb.inv_freq.numpy()
    hd = cfg.hidden_size // cfg.num_attention_heads
    base = 1.0 / (rope_theta(cfg) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    w.add_tensor("rope_freqs.weight", (base / inv.astype(np.float64)).astype(np.float32))

    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    ref_sd = {}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output.weight", quantize(sd["lm_head.weight"], Q.Q8_0), raw_dtype=Q.Q8_0)
    ref_sd["lm_head.weight"] = dequantize(quantize(sd["lm_head.weight"], Q.Q8_0), Q.Q8_0)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        for hf, gg in names.items():
            key = p + ("self_attn." if hf.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp.") + hf + ".weight"
            m = sd[key]
            qt = types[hf]
            mq = m
            if hf == "q_proj":
                mq = permute_qk(m, cfg.num_attention_heads)
            if hf == "k_proj":
                mq = permute_qk(m, cfg.num_key_value_heads)
            if qt == Q.F16:
                w.add_tensor(f"blk.{i}.{gg}.weight", mq.astype(np.float16))
                ref_sd[key] = m.astype(np.float16).astype(np.float32)
            else:
                w.add_tensor(f"blk.{i}.{gg}.weight", quantize(mq, qt), raw_dtype=qt)
                ref_sd[key] = dequantize(quantize(m, qt), qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():
        sdict = model.state_dict()
        for k, v in ref_sd.items():
            sdict[k].copy_(torch.from_numpy(np.ascontiguousarray(v)).reshape(sdict[k].shape))
        ids = json.load(open(os.path.join(src, "reference_text.json")))["token_ids"]
        logits = model(torch.tensor([ids])).logits[0]
    save_np({"input_ids": np.array(ids, dtype=np.int64), "logits": logits.numpy().astype(np.float32)},
            os.path.join(FIX, "tiny", "llama-quant.reference.safetensors"))
    print("tiny gguf written", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llama-tokenize", default=None)
    ap.add_argument("--only", choices=["smollm2", "tiny"], default=None)
    a = ap.parse_args()
    os.makedirs(os.path.join(FIX, "tiny"), exist_ok=True)
    torch.set_num_threads(2)
    if a.only in (None, "tiny"):
        tiny_models()
        tiny_gguf()
    if a.only in (None, "smollm2"):
        smollm2(a.gguf, a.llama_tokenize)


if __name__ == "__main__":
    main()
