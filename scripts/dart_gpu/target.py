"""The target of the DART and DFlash campaigns on a lent GPU (../dart_gpu/train.py, ../dflash_gpu/train.py): its GGUF read and dequantised
(F32, F16, Q8_0, Q4_1), its forward in bf16 with the taps the drafter needs, batched sampling
with a K/V cache (self-distillation on the GPU), and the campaign's token files
(`PDTK0001`: records of little-endian u32 `[prompt_index, prompt_len, n, token × n]`)."""
import gzip
import json
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

TAPS = (1, 14, 26)  # dart_taps(30): 1, 30/2 - 1, 30 - 4; plus the last layer for the labels


# ---------------------------------------------------------------- GGUF (F32, F16, Q8_0, Q4_1)
def read_gguf(path):
    """Tensors of a llama GGUF as float32 numpy arrays `[rows, cols]`, and its metadata."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, buf, at)
        at += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal at
        n = take("Q")
        s = bytes(buf[at : at + n]).decode("utf-8", "replace")
        at += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    if bytes(buf[:4]) != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    at = 4
    take("I")  # the version
    n_t, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        infos.append((name, dims, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    base = (at + align - 1) // align * align
    out = {}
    for name, dims, ty, off in infos:
        cols, rows = dims[0], int(np.prod(dims[1:])) if len(dims) > 1 else 1
        n = cols * rows
        o = base + off
        if ty == 0:
            w = np.frombuffer(buf, np.float32, n, o).copy()
        elif ty == 1:
            w = np.frombuffer(buf, np.float16, n, o).astype(np.float32)
        elif ty == 8:  # Q8_0: f16 d, 32 int8
            b = np.frombuffer(buf, np.uint8, n // 32 * 34, o).reshape(-1, 34)
            d = b[:, :2].copy().view(np.float16).astype(np.float32)
            w = (b[:, 2:].copy().view(np.int8).astype(np.float32) * d).reshape(-1)
        elif ty == 3:  # Q4_1: f16 d, f16 m, 16 bytes of nibbles (low halves first)
            b = np.frombuffer(buf, np.uint8, n // 32 * 20, o).reshape(-1, 20)
            d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
            m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
            q = b[:, 4:]
            nib = np.concatenate([q & 15, q >> 4], axis=1).astype(np.float32)
            w = (nib * d + m).reshape(-1)
        else:
            raise SystemExit(f"{path}: tensor {name} has GGUF type {ty}, not supported here")
        out[name] = w.reshape(rows, cols) if len(dims) > 1 else w
    return out, meta


# ---------------------------------------------------------------- safetensors (the drafter's files)
ST = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64, "BOOL": np.bool_}


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        b = raw[8 + n + lo : 8 + n + hi]
        if v["dtype"] == "BF16":
            x = (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(b, ST[v["dtype"]])
        out[k] = x.reshape(v["shape"])
    return out


def write_safetensors(path, tensors):
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.bool_): "BOOL"}
    head, blobs, at = {}, [], 0
    for k in sorted(tensors):
        x = np.ascontiguousarray(tensors[k])
        b = x.tobytes()
        head[k] = dict(dtype=names[x.dtype], shape=list(x.shape), data_offsets=[at, at + len(b)])
        blobs.append(b)
        at += len(b)
    h = json.dumps(head).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- the target (llama, GGUF layout)
def rms(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class Target:
    def __init__(self, path, dev):
        t, meta = read_gguf(path)
        g = lambda k: meta[f"llama.{k}"]
        self.n_layers, self.h = g("block_count"), g("embedding_length")
        self.nh, self.nkv = g("attention.head_count"), g("attention.head_count_kv")
        self.hd = self.h // self.nh
        self.eps = g("attention.layer_norm_rms_epsilon")
        theta = g("rope.freq_base")
        bf = lambda n: torch.from_numpy(t[n]).to(dev, torch.bfloat16)
        f32 = lambda n: torch.from_numpy(t[n]).to(dev, torch.float32)
        self.emb = f32("token_embd.weight")  # [vocab, h]; tied output head
        self.head = f32("output.weight") if "output.weight" in t else self.emb
        self.out_norm = f32("output_norm.weight")
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            self.layers.append(
                dict(
                    an=bf(p + "attn_norm.weight"),
                    qkv=torch.cat([bf(p + "attn_q.weight"), bf(p + "attn_k.weight"), bf(p + "attn_v.weight")]),
                    o=bf(p + "attn_output.weight"),
                    fn=bf(p + "ffn_norm.weight"),
                    gu=torch.cat([bf(p + "ffn_gate.weight"), bf(p + "ffn_up.weight")]),
                    d=bf(p + "ffn_down.weight"),
                )
            )
        self.eos = meta.get("tokenizer.ggml.eos_token_id", 2)
        # The chat's end of turn and the end of text (SmolLM2: <|im_end|> 2, <|endoftext|> 0).
        toks = meta.get("tokenizer.ggml.tokens", [])
        self.stop_ids = {i for i, t in enumerate(toks) if t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")}
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.hd, 2, device=dev, dtype=torch.float32) / self.hd)

    def rope(self, x, cos, sin):
        # GGUF llama weights are permuted for adjacent-pair rotation (llama.cpp's "norm" RoPE).
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        return torch.stack([a, b], -1).flatten(-2).to(x.dtype)

    def layer(self, L, x, cos, sin, attend):
        """One layer over `x` `[B, n, h]`; `attend(q, k, v)` gives the attention output
        `[B, heads, n, hd]` from q `[B, n, heads, hd]` and this step's k, v `[B, n, kv, hd]`."""
        B, n, h = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        u = rms(x, L["an"], self.eps)
        qkv = u @ L["qkv"].T
        q = self.rope(qkv[..., :h].view(B, n, nh, hd), cos, sin)
        k = self.rope(qkv[..., h : h + nkv * hd].view(B, n, nkv, hd), cos, sin)
        v = qkv[..., h + nkv * hd :].view(B, n, nkv, hd)
        a = attend(q, k, v)
        x = x + a.transpose(1, 2).reshape(B, n, h) @ L["o"].T
        u = rms(x, L["fn"], self.eps)
        gu = u @ L["gu"].T
        ff = gu.shape[-1] // 2
        return x + (F.silu(gu[..., :ff]) * gu[..., ff:]) @ L["d"].T

    @torch.no_grad()
    def generate(self, prompts, max_new, temperature, stop, seed):
        """Answers `prompts` (token lists) at `temperature` (0: greedy), at most `max_new` tokens
        each, ending before a token of `stop`; one batch, left-padded, with a K/V cache."""
        dev = self.emb.device
        B, P = len(prompts), max(len(p) for p in prompts)
        T = P + max_new
        pad = torch.tensor([P - len(p) for p in prompts], device=dev)
        tok = torch.zeros((B, P), dtype=torch.long, device=dev)
        for s, p in enumerate(prompts):
            tok[s, P - len(p) :] = torch.tensor(p, device=dev)
        kc = torch.zeros((self.n_layers, B, self.nkv, T, self.hd), dtype=torch.bfloat16, device=dev)
        vc = torch.zeros_like(kc)
        kidx = torch.arange(T, device=dev)
        gen = torch.Generator(device=dev).manual_seed(seed)
        rep = self.nh // self.nkv

        def run(x_tok, start):
            n = x_tok.shape[1]
            slots = start + torch.arange(n, device=dev)
            ang = (slots[None] - pad[:, None]).float()[..., None] * self.inv_freq
            cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
            ks = kidx[None, None, : start + n]
            # A padding row sees itself only: a row that sees nothing would be NaN, and 0 × NaN
            # in the attention's products would reach the real rows through the cache.
            vis = ((ks <= slots[None, :, None]) & (ks >= pad[:, None, None])) | (ks == slots[None, :, None])
            x = self.emb[x_tok].to(torch.bfloat16)
            for li, L in enumerate(self.layers):

                def attend(q, k, v, li=li):
                    kc[li, :, :, start : start + n] = k.transpose(1, 2)
                    vc[li, :, :, start : start + n] = v.transpose(1, 2)
                    K = kc[li, :, :, : start + n].repeat_interleave(rep, dim=1)
                    V = vc[li, :, :, : start + n].repeat_interleave(rep, dim=1)
                    return F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=vis[:, None])

                x = self.layer(L, x, cos, sin, attend)
            return rms(x[:, -1].float(), self.out_norm, self.eps) @ self.head.T

        logits = run(tok, 0)
        out = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        stop_t = torch.tensor(sorted(stop), device=dev)
        for i in range(max_new):
            if temperature > 0:
                probs = torch.softmax(logits / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            else:
                nxt = logits.argmax(-1)
            done |= torch.isin(nxt, stop_t)
            for s, (t_, d_) in enumerate(zip(nxt.tolist(), done.tolist())):
                if not d_ and len(out[s]) == i:
                    out[s].append(t_)
            if bool(done.all()) or i + 1 == max_new:
                break
            logits = run(nxt[:, None], P + i)
        return out

    @torch.no_grad()
    def forward(self, tokens, taps=TAPS):
        """tokens `[B, T]` (right-padded) → the outputs of layers `taps` side by side
        `[B, T, len(taps)·h]` (bf16) and last-layer outputs `[B, T, h]` (f32)."""
        B, T = tokens.shape
        x = self.emb[tokens].to(torch.bfloat16)
        pos = torch.arange(T, device=tokens.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None]
        cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
        rep = self.nh // self.nkv

        def attend(q, k, v):
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

        out = []
        for li, L in enumerate(self.layers):
            x = self.layer(L, x, cos, sin, attend)
            if li in taps:
                out.append(x)
        return torch.cat(out, -1), x.float()


def samples_of(path):
    """Every complete record of a token file (`.gz` read compressed): (tokens, prompt length,
    prompt index)."""
    raw = open(path, "rb").read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    if raw[:8] != b"PDTK0001":
        raise SystemExit(f"{path}: missing PDTK0001 header")
    w = np.frombuffer(raw, np.uint32, (len(raw) - 8) // 4, 8)
    out, at = [], 0
    while at + 3 <= len(w):
        n = int(w[at + 2])
        if at + 3 + n > len(w):
            break
        out.append((w[at + 3 : at + 3 + n].astype(np.int64).tolist(), int(w[at + 1]), int(w[at])))
        at += 3 + n
    return out




def append_samples(path, samples):
    """Appends (tokens, prompt length, prompt index) records to an uncompressed token file."""
    new = not os.path.exists(path)
    with open(path, "ab") as f:
        if new:
            f.write(b"PDTK0001")
        for toks, plen, pidx in samples:
            f.write(np.asarray([pidx, plen, len(toks)] + list(toks), dtype="<u4").tobytes())
