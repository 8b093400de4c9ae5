#!/usr/bin/env python3
"""Writes the fixtures of the model families beyond Llama / Qwen: a tiny random-weight model per
family from transformers, its reference outputs, and the same model as a GGUF the way llama.cpp's
converter writes it. Run once by hand; the tests only read what it wrote.

    python3 -m venv --system-site-packages ~/venv-ref && ~/venv-ref/bin/pip install transformers gguf
    ~/venv-ref/bin/python scripts/make_family_fixtures.py

Outputs (under fixtures/tiny/):
  gemma3/            a Gemma 3 text model (Gemma3ForCausalLM, float32 safetensors): 4 layers, two
                     of them sliding (window 8, shorter than the reference text), q/k norms,
                     post-norms, GeGLU, scaled embeddings, a linear RoPE scaling on the global
                     layers and its own base on the sliding ones, a final logit soft-cap; the
                     tiny byte-level BPE tokenizer of the other tiny models; reference.safetensors
                     (input ids, logits, every layer's output) and reference_text.json
  gemma3.gguf        the same weights as llama.cpp's converter writes them (RMSNorm weights as
                     1 + w, GGUF names, gemma3.* keys) with a SentencePiece vocabulary of the same
                     size (the first 384 pieces of fixtures/tokenizers/llama-spm.gguf, no space
                     prefix as Gemma files have it)
  gemma2/, gemma2.gguf, gemma/, gemma.gguf
                     Gemma 2 (every other layer sliding, window 8; attention soft-cap 5 — low, so
                     that it bites on random weights — and final soft-cap 30; the GGUF leaves the
                     sliding pattern to llama.cpp's default) and Gemma 1 (GeGLU, scaled
                     embeddings, no post-norms), written the same way
  phi3/, phi3.gguf   a Phi-3 model (Phi3ForCausalLM, float32, fused qkv_proj and gate_up_proj, no
                     sliding window), and the same as a GGUF as llama.cpp writes Phi-3 (attn_qkv,
                     ffn_up of twice the MLP width) with the SentencePiece vocabulary named Phi3
  qwen3moe/, qwen3moe.gguf
                     a Qwen3-MoE model (Qwen3MoeForCausalLM, float32: 3 layers of 8 experts, 2 per
                     token, renormalised; q/k norms), and the same as llama.cpp writes it
                     (qwen3moe.* keys, stacked ffn_*_exps tensors, the router as ffn_gate_inp)
  qwen2moe/, qwen2moe.gguf
                     a Qwen2-MoE model (Qwen2MoeForCausalLM, float32: 3 layers of 8 experts, 2 per
                     token, not renormalised; q/k/v biases; a shared expert of width 96 behind its
                     sigmoid gate), and the same as llama.cpp writes it (qwen2moe.* keys,
                     ffn_*_shexp and ffn_gate_inp_shexp)
  phi3-longrope/, phi3-longrope.gguf
                     a Phi-3 with LongRoPE (original context 64 of 256; reference_long.safetensors
                     holds 130 tokens, past it), as HF and as llama.cpp writes it
  mixtral/, mixtral.gguf
                     a Mixtral model (MixtralForCausalLM, float32: 3 layers of 4 experts, 2 per
                     token), and the same as llama.cpp writes it (architecture llama with
                     llama.expert_* keys, q/k rows permuted for its interleaved RoPE)
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file as save_np

sys.path.insert(0, os.path.dirname(__file__))
from make_fixtures import FIX, randomise, tiny_tokenizer  # noqa: E402

TEXT = "<|im_start|>user\nExplain why the sky is blue, with numbers 12345.<|im_end|>\n<|im_start|>assistant\n"


def hf_model(name, cls, cfg, seed, gemma_norms):
    """Writes fixtures/tiny/NAME: the tiny tokenizer, a random-weight model (Gemma's RMSNorm
    weights as small offsets from 1 when `gemma_norms`), its reference outputs. Returns the
    reloaded float32 model (eager attention) and the reference ids."""
    out = os.path.join(FIX, "tiny", name)
    os.makedirs(out, exist_ok=True)
    tk = tiny_tokenizer(out)
    torch.manual_seed(seed)
    model = cls(cfg)
    randomise(model, 100 + seed)
    if gemma_norms:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.sub_(1.0)
    model = model.float()
    model.save_pretrained(out, safe_serialization=True)
    ref = cls.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = tk.encode(TEXT).ids
    with torch.no_grad():
        o = ref(torch.tensor([ids]), output_hidden_states=True)
    hidden = torch.stack([h[0] for h in o.hidden_states[1:]])
    save_np({"input_ids": np.array(ids, dtype=np.int64),
             "logits": o.logits[0].numpy().astype(np.float32),
             "hidden": hidden.numpy().astype(np.float32)},
            os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference_text.json"), "w") as fh:
        json.dump({"text": TEXT, "token_ids": ids}, fh)
    print(f"tiny {name}: {len(ids)} tokens", file=sys.stderr)
    return ref, ids


def gguf_header(w, cfg, head_dim=True):
    """The shape keys every family writes (key/value lengths when `head_dim`), in this order."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if head_dim:
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def gguf_spm(w, n, space_prefix):
    """A SentencePiece vocabulary of the first `n` Llama 2 pieces; `space_prefix` False writes
    add_space_prefix = false (Gemma), None leaves the key out."""
    tokens, scores, types = spm_vocab(n)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if space_prefix is not None:
        w.add_add_space_prefix(space_prefix)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)


def gguf_close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    cfg = Gemma3TextConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=2, pad_token_id=1, rms_norm_eps=1e-6,
        sliding_window=8, layer_types=layer_types, query_pre_attn_scalar=16,
        final_logit_softcapping=30.0, attn_logit_softcapping=None, tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    )
    ref, ids = hf_model("gemma3", Gemma3ForCausalLM, cfg, 3, True)
    assert len(ids) > 3 * cfg.sliding_window, len(ids)
    gemma3_gguf(ref, layer_types)


def spm_vocab(n):
    """The first `n` pieces (with scores and types) of the Llama 2 SentencePiece vocabulary."""
    import gguf

    r = gguf.GGUFReader(os.path.join(FIX, "tokenizers", "llama-spm.gguf"))
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()[:n]
    scores = f["tokenizer.ggml.scores"].contents()[:n]
    types = f["tokenizer.ggml.token_type"].contents()[:n]
    return tokens, scores, types


def gemma3_gguf(model, layer_types):
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(os.path.join(FIX, "tiny", "gemma3.gguf"), "gemma3")
    gguf_header(w, cfg)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_sliding_window(cfg.sliding_window)
    w.add_array("gemma3.attention.sliding_window_pattern", [t == "sliding_attention" for t in layer_types])
    w.add_float32("gemma3.rope.freq_base_swa", 10000.0)
    w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    gguf_spm(w, cfg.vocab_size, False)
    w.add_chat_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    plus = lambda a: (a + 1.0).astype(np.float32)  # llama.cpp's converter: 1 + w
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", plus(sd["model.norm.weight"]))
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            a = sd[f"model.layers.{i}.{hf}.weight"]
            w.add_tensor(f"blk.{i}.{gg}.weight", plus(a) if "norm" in hf else a)
    gguf_close(w)
    print("tiny gemma3.gguf written", file=sys.stderr)


def gemma_older(name):
    """Gemma 1 or 2: the HF model, its reference, and its GGUF."""
    import gguf
    from transformers import Gemma2Config, Gemma2ForCausalLM, GemmaConfig, GemmaForCausalLM

    common = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  bos_token_id=0, eos_token_id=2, pad_token_id=1, rms_norm_eps=1e-6,
                  hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if name == "gemma2":
        cls = Gemma2ForCausalLM
        cfg = Gemma2Config(**common, sliding_window=8, query_pre_attn_scalar=16,
                           attn_logit_softcapping=5.0, final_logit_softcapping=30.0)
    else:
        cls = GemmaForCausalLM
        cfg = GemmaConfig(**common)
    ref, ids = hf_model(name, cls, cfg, 5, True)
    w = gguf.GGUFWriter(os.path.join(FIX, "tiny", f"{name}.gguf"), name)
    gguf_header(w, cfg)
    w.add_rope_freq_base(10000.0)
    if name == "gemma2":
        w.add_sliding_window(cfg.sliding_window)
        w.add_float32("gemma2.attn_logit_softcapping", cfg.attn_logit_softcapping)
        w.add_float32("gemma2.final_logit_softcapping", cfg.final_logit_softcapping)
    gguf_spm(w, cfg.vocab_size, False)
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    plus = lambda a: (a + 1.0).astype(np.float32)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", plus(sd["model.norm.weight"]))
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    if name == "gemma2":
        names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            a = sd[f"model.layers.{i}.{hf}.weight"]
            w.add_tensor(f"blk.{i}.{gg}.weight", plus(a) if "norm" in hf else a)
    gguf_close(w)
    print(f"tiny {name}.gguf written", file=sys.stderr)


def gemma2():
    gemma_older("gemma2")


def gemma():
    gemma_older("gemma")


def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM

    cfg = Phi3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     original_max_position_embeddings=256, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                     rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ref, ids = hf_model("phi3", Phi3ForCausalLM, cfg, 4, False)
    phi3_gguf("phi3", ref, cfg)


def phi3_gguf(name, ref, cfg, longrope=None, rotary=None):
    """fixtures/tiny/NAME.gguf as llama.cpp writes Phi-3 (attn_qkv, ffn_up of twice the MLP
    width), with `longrope` = (short, long, original, attn_factor) as its converter writes it."""
    import gguf

    w = gguf.GGUFWriter(os.path.join(FIX, "tiny", f"{name}.gguf"), "phi3")
    w.add_name("Phi3")
    gguf_header(w, cfg, head_dim=False)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(rotary or cfg.hidden_size // cfg.num_attention_heads)
    if longrope:
        w.add_uint32("phi3.rope.scaling.original_context_length", longrope[2])
        w.add_float32("phi3.rope.scaling.attn_factor", longrope[3])
    gguf_spm(w, cfg.vocab_size, None)
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", sd["lm_head.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    if longrope:
        w.add_tensor("rope_factors_short.weight", np.array(longrope[0], dtype=np.float32))
        w.add_tensor("rope_factors_long.weight", np.array(longrope[1], dtype=np.float32))
    names = {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            w.add_tensor(f"blk.{i}.{gg}.weight", sd[f"model.layers.{i}.{hf}.weight"])
    gguf_close(w)
    print(f"tiny {name}.gguf written", file=sys.stderr)


def long_reference(name, ref, ids):
    """fixtures/tiny/NAME/reference_long.safetensors: `ref`'s logits over 130 tokens (the reference
    ids repeated), past a LongRoPE original context of 64."""
    long_ids = (ids * 4)[:130]
    with torch.no_grad():
        o = ref(torch.tensor([long_ids]))
    save_np({"input_ids": np.array(long_ids, dtype=np.int64), "logits": o.logits[0].numpy().astype(np.float32)},
            os.path.join(FIX, "tiny", name, "reference_long.safetensors"))


def phi3_longrope():
    """A Phi-3 with LongRoPE (Phi-3.5-mini's scheme): original context 64 of 256, so the 42-token
    reference takes the short factors and reference_long.safetensors (130 tokens) the long ones,
    cos/sin scaled by √(1 + ln 4 / ln 64); and its GGUF as llama.cpp's converter writes it
    (rope_factors_short / _long tensors, phi3.rope.scaling.* keys)."""
    import math
    from transformers import Phi3Config, Phi3ForCausalLM

    g = torch.Generator().manual_seed(11)
    short = (1.0 + 0.5 * torch.rand(8, generator=g)).tolist()
    long = (1.0 + 6.0 * torch.rand(8, generator=g)).tolist()
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": 64}
    cfg = Phi3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     original_max_position_embeddings=64, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                     rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False, rope_parameters=rope)
    ref, ids = hf_model("phi3-longrope", Phi3ForCausalLM, cfg, 7, False)
    long_reference("phi3-longrope", ref, ids)
    phi3_gguf("phi3-longrope", ref, cfg, (short, long, 64, math.sqrt(1 + math.log(4) / math.log(64))))


def qwen2_window():
    """Qwen2 with use_sliding_window: a window of 8 on the layers from max_window_layers (1) on,
    over the 42-token reference."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      use_sliding_window=True, sliding_window=8, max_window_layers=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    hf_model("qwen2-window", Qwen2ForCausalLM, cfg, 9, False)


def phi4_mini():
    """Phi-4-mini's scheme at a tiny size: partial rotary embeddings (half of each 16-wide head
    rotated), LongRoPE over the rotated half (original context 64 of 256), tied embeddings; the
    42-token reference takes the short factors, reference_long.safetensors (130 tokens) the long
    ones; its GGUF as llama.cpp's converter writes it (phi3.rope.dimension_count 8, no
    output.weight)."""
    import math
    from transformers import Phi3Config, Phi3ForCausalLM

    g = torch.Generator().manual_seed(13)
    short = (1.0 + 0.5 * torch.rand(4, generator=g)).tolist()
    long = (1.0 + 6.0 * torch.rand(4, generator=g)).tolist()
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5}
    cfg = Phi3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     original_max_position_embeddings=64, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                     rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=True, rope_parameters=rope,
                     partial_rotary_factor=0.5)
    ref, ids = hf_model("phi4-mini", Phi3ForCausalLM, cfg, 8, False)
    long_reference("phi4-mini", ref, ids)
    phi3_gguf("phi4-mini", ref, cfg, (short, long, 64, math.sqrt(1 + math.log(4) / math.log(64))), rotary=8)


def permute(w, n_head):
    """q/k rows reordered for GGML's interleaved RoPE, as llama.cpp's converter does for llama."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def moe_gguf(name, arch, ref, cfg, n_experts, expert_names, permute_qk):
    """Writes fixtures/tiny/NAME.gguf from the reloaded model `ref`: stacked expert tensors."""
    import gguf

    w = gguf.GGUFWriter(os.path.join(FIX, "tiny", f"{name}.gguf"), arch)
    w.add_name(name)
    gguf_header(w, cfg, head_dim=arch != "llama")
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_expert_count(n_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    gguf_spm(w, cfg.vocab_size, None)
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    # transformers 5 keeps the experts fused in memory; the saved checkpoint has one tensor each.
    from safetensors.numpy import load_file
    saved = load_file(os.path.join(FIX, "tiny", name, "model.safetensors"))
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if key not in saved:
                    continue
                a = saved[key]
                if permute_qk and gg in heads:
                    a = permute(a, heads[gg])
                w.add_tensor(f"blk.{i}.{gg}.{kind}", a)
        router, experts = expert_names
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", saved[f"model.layers.{i}.{router}.weight"])
        for gg, proj in [("ffn_gate_exps", "gate"), ("ffn_up_exps", "up"), ("ffn_down_exps", "down")]:
            stack = np.stack([saved[f"model.layers.{i}.{experts(e, proj)}.weight"] for e in range(n_experts)])
            w.add_tensor(f"blk.{i}.{gg}.weight", stack)
        shared = {"ffn_gate_shexp": "shared_expert.gate_proj", "ffn_up_shexp": "shared_expert.up_proj",
                  "ffn_down_shexp": "shared_expert.down_proj", "ffn_gate_inp_shexp": "shared_expert_gate"}
        for gg, hf in shared.items():
            key = f"model.layers.{i}.mlp.{hf}.weight"
            if key in saved:
                w.add_tensor(f"blk.{i}.{gg}.weight", saved[key])
    gguf_close(w)
    print(f"tiny {name}.gguf written", file=sys.stderr)


def qwen3moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=384, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                         max_position_embeddings=256, bos_token_id=0, eos_token_id=2, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ref, _ = hf_model("qwen3moe", Qwen3MoeForCausalLM, cfg, 5, False)
    moe_gguf("qwen3moe", "qwen3moe", ref, cfg, 8,
             ("mlp.gate", lambda e, p: f"mlp.experts.{e}.{p}_proj"), False)


def qwen2moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(vocab_size=384, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                         shared_expert_intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                         qkv_bias=True, max_position_embeddings=256, bos_token_id=0, eos_token_id=2,
                         rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ref, _ = hf_model("qwen2moe", Qwen2MoeForCausalLM, cfg, 9, False)
    moe_gguf("qwen2moe", "qwen2moe", ref, cfg, 8,
             ("mlp.gate", lambda e, p: f"mlp.experts.{e}.{p}_proj"), False)


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=384, hidden_size=64, intermediate_size=48, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=256, bos_token_id=0,
                        eos_token_id=2, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ref, _ = hf_model("mixtral", MixtralForCausalLM, cfg, 6, False)
    w_of = {"gate": "w1", "down": "w2", "up": "w3"}
    moe_gguf("mixtral", "llama", ref, cfg, 4,
             ("block_sparse_moe.gate", lambda e, p: f"block_sparse_moe.experts.{e}.{w_of[p]}"), True)


if __name__ == "__main__":
    which = sys.argv[1:] or ["gemma", "gemma2", "gemma3", "phi3", "qwen3moe", "mixtral", "phi3_longrope",
                             "phi4_mini", "qwen2_window", "qwen2moe"]
    for name in which:
        globals()[name]()
