#!/usr/bin/env python3
"""THE DART campaign's objective on a lent GPU (PyTorch; the device machines have no Rust).

The same network, data and loss as `paradraft train campaign` (crates/paradraft/src/train/dart,
train/campaign): the target's taps (outputs of layers 1, 14, 26) and its distribution over the
draft vocabulary are computed inside each step from token sequences (online teacher forcing,
here with the GGUF weights dequantised to bf16 instead of the engine's int8 kernels); the
drafter sees the prefix-shared layout (every clean slot of a sequence, then blocks of 7 mask
slots for sampled prefixes); the loss is the label's cross-entropy plus the KL from the target's
draft-vocabulary distribution, weighted gamma^(depth-1); AdamW (0.9, 0.999, 1e-8, no decay),
global gradient clipping, an EMA of the weights. Only the greedy self-distilled samples are
trained on (their own tokens are the labels); the held-out split is the campaign's (the last 5 %
of the seed samples) and the held-out chain evaluation is `dart::evaluate`'s.

Nothing here is the product: it reads/writes numpy files that `scripts/dart_gpu/prepare.py`
It starts from a drafter in the published layout and writes one (EMA weights, f16, the same
d2t/t2d) that `paradraft train campaign --from` takes back (docs/dart.md, "A lent GPU"); the Rust
held-out evaluation of that drafter is what counts.

  python3 train.py --model M.gguf --samples samples.bin.gz --n-seed 5131 --drafter DIR --out OUT
                   [--minutes 9] [--state S.pt]
"""
import argparse
import gzip
import json
import math
import os
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F

TAPS = (1, 14, 26)  # dart_taps(30): 1, 30/2 - 1, 30 - 4; plus the last layer for the labels
MASKS = 7
GAMMA = 0.6


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
    _version, n_t, n_kv = take("I"), take("Q"), take("Q")
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
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.hd, 2, device=dev, dtype=torch.float32) / self.hd)

    def rope(self, x, cos, sin):
        # GGUF llama weights are permuted for adjacent-pair rotation (llama.cpp's "norm" RoPE).
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        return torch.stack([a, b], -1).flatten(-2).to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens):
        """tokens `[B, T]` (right-padded) → taps `[B, T, 3h]` (bf16) and last-layer outputs
        `[B, T, h]` (f32)."""
        B, T = tokens.shape
        x = self.emb[tokens].to(torch.bfloat16)
        pos = torch.arange(T, device=tokens.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None]
        cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]
        taps = []
        h, nh, nkv, hd = self.h, self.nh, self.nkv, self.hd
        for li, L in enumerate(self.layers):
            u = rms(x, L["an"], self.eps)
            qkv = u @ L["qkv"].T
            q = self.rope(qkv[..., :h].view(B, T, nh, hd), cos, sin)
            k = self.rope(qkv[..., h : h + nkv * hd].view(B, T, nkv, hd), cos, sin)
            v = qkv[..., h + nkv * hd :].view(B, T, nkv, hd)
            k = k.repeat_interleave(nh // nkv, dim=2)
            v = v.repeat_interleave(nh // nkv, dim=2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + a.transpose(1, 2).reshape(B, T, h) @ L["o"].T
            u = rms(x, L["fn"], self.eps)
            gu = u @ L["gu"].T
            ff = gu.shape[-1] // 2
            x = x + (F.silu(gu[..., :ff]) * gu[..., ff:]) @ L["d"].T
            if li in TAPS:
                taps.append(x)
        return torch.cat(taps, -1), x.float()


# ---------------------------------------------------------------- the drafter (train/dart/net.rs)
NAMES = [
    "fc.weight", "midlayer.mask_rep", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "norm.weight", "lm_head.weight",
]


class Drafter(torch.nn.Module):
    def __init__(self, w, cfg):
        super().__init__()
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(torch.from_numpy(w[n]).float()) for n in NAMES})
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        hd, theta = self.hd, cfg["rope_theta"]
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd).float())

    def w(self, n):
        return self.p[n.replace(".", "__")]

    def state(self):
        return {n: self.w(n).detach().float().cpu().numpy() for n in NAMES}

    def forward(self, b):
        """Logits over the draft vocabulary of the scored slots `b["out"]` (flat indices into
        `[B * N]`)."""
        m = lambda s: self.w("midlayer." + s)
        B, C = b["next_emb"].shape[:2]
        N, h, nh, nkv, hd = b["mask"].shape[-1], self.h, self.nh, self.nkv, self.hd
        A7 = N - C
        g = b["feat"] @ self.w("fc.weight").T.to(torch.bfloat16)
        ue = rms(b["next_emb"].float(), m("input_layernorm.weight"), self.eps)
        ug = rms(g.float(), m("hidden_norm.weight"), self.eps)
        rep = m("mask_rep")
        u = torch.cat([torch.cat([ue, ug], -1), rep.expand(B, A7, 2 * h)], 1)
        resid = torch.cat([g.float(), rep[:h].expand(B, A7, h)], 1)
        ub = u.to(torch.bfloat16)
        q = (ub @ m("self_attn.q_proj.weight").T.to(torch.bfloat16)).view(B, N, nh, hd)
        k = (ub @ m("self_attn.k_proj.weight").T.to(torch.bfloat16)).view(B, N, nkv, hd)
        v = (ub @ m("self_attn.v_proj.weight").T.to(torch.bfloat16)).view(B, N, nkv, hd)
        ang = b["pos"].float()[..., None] * self.inv_freq  # [B, N, hd/2]
        cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]

        def rope(x):  # rotate-half, as graph::rope
            x1, x2 = x[..., : hd // 2].float(), x[..., hd // 2 :].float()
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(torch.bfloat16)

        q, k = rope(q), rope(k)
        k = k.repeat_interleave(nh // nkv, dim=2)
        v = v.repeat_interleave(nh // nkv, dim=2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=b["mask"][:, None])
        o = a.transpose(1, 2).reshape(B, N, nh * hd)
        x = resid + (o @ m("self_attn.o_proj.weight").T.to(torch.bfloat16)).float()
        x = x.reshape(B * N, h)[b["out"]]
        xn = rms(x, m("post_attention_layernorm.weight"), self.eps).to(torch.bfloat16)
        gate = F.silu(xn @ m("mlp.gate_proj.weight").T.to(torch.bfloat16))
        up = xn @ m("mlp.up_proj.weight").T.to(torch.bfloat16)
        x = x + ((gate * up) @ m("mlp.down_proj.weight").T.to(torch.bfloat16)).float()
        nw = self.w("norm.weight")
        y = rms(rms(x, nw, self.eps), nw, self.eps)
        return (y.to(torch.bfloat16) @ self.w("lm_head.weight").T.to(torch.bfloat16)).float()


# ---------------------------------------------------------------- the prefix-shared layout
def layout(seqs, anchors, dev):
    """Index tensors of the prefix-shared layout for sequences `seqs` (lists of token ids with
    their prompt length) and their sorted prefixes `anchors` (lists): clean slots 0..T-2, then
    7 mask slots per prefix; the visibility mask; per scored slot its label position, depth and
    weight (`dart::build`)."""
    B = len(seqs)
    C = max(len(t) for t, _ in seqs) - 1
    A = max(1, max(len(a) for a in anchors))
    N = C + A * MASKS
    pos = np.zeros((B, N), np.int64)
    qg = np.zeros((B, N), np.int64)  # the last clean key each slot sees
    blk = np.full((B, N), -1, np.int64)  # a mask slot's block
    jj = np.zeros((B, N), np.int64)  # a mask slot's index in its block (1..7)
    out, lab_pos, depth, weight, seq_of = [], [], [], [], []
    for s, ((toks, plen), anc) in enumerate(zip(seqs, anchors)):
        t = len(toks)
        clean = t - 1
        pos[s, :C] = np.arange(C)
        qg[s, :C] = np.arange(C)
        n_valid = max(1, (t - 2) - max(plen - 2, 0))
        cw = min(len(anc) / n_valid, 1.0)
        for i in range(clean):
            p = i + 2
            if plen <= p < t:
                out.append(s * N + i), lab_pos.append(p), depth.append(1), weight.append(cw), seq_of.append(s)
        for a, g0 in enumerate(anc):
            b0 = C + a * MASKS
            pos[s, b0 : b0 + MASKS] = g0 + np.arange(1, MASKS + 1)
            qg[s, b0 : b0 + MASKS] = g0
            blk[s, b0 : b0 + MASKS] = a
            jj[s, b0 : b0 + MASKS] = np.arange(1, MASKS + 1)
            for j in range(1, MASKS + 1):
                p = g0 + 2 + j
                if plen <= p < t:
                    out.append(s * N + b0 + j - 1), lab_pos.append(p), depth.append(j + 1)
                    weight.append(GAMMA**j), seq_of.append(s)
        for a in range(len(anc), A):  # padding blocks see clean slot 0 only
            b0 = C + a * MASKS
            blk[s, b0 : b0 + MASKS] = A + a
    T = lambda x: torch.from_numpy(np.asarray(x)).to(dev)
    pos, qg, blk, jj = T(pos), T(qg), T(blk), T(jj)
    kidx = torch.arange(N, device=dev)
    kclean = kidx < C
    vis = (kclean[None, None, :] & (kidx[None, None, :] <= qg[:, :, None])) | (
        (~kclean)[None, None, :] & (blk[:, None, :] == blk[:, :, None]) & (jj[:, None, :] <= jj[:, :, None])
    )
    return dict(
        C=C, N=N, pos=pos, mask=vis, out=T(np.asarray(out, np.int64)), lab_pos=T(np.asarray(lab_pos, np.int64)),
        depth=T(np.asarray(depth, np.int64)), weight=T(np.asarray(weight, np.float32)), seq=T(np.asarray(seq_of, np.int64)),
    )


def batch_inputs(target, seqs, anchors, dev):
    """Runs the target over the sequences and fills the drafter's inputs."""
    L = layout(seqs, anchors, dev)
    T = L["C"] + 1
    tok = torch.zeros((len(seqs), T), dtype=torch.long)
    for s, (t, _) in enumerate(seqs):
        tok[s, : len(t)] = torch.tensor(t)
    tok = tok.to(dev)
    taps, last = target.forward(tok)
    L["feat"] = taps[:, : T - 1]
    L["next_emb"] = target.emb[tok[:, 1:]]
    L["tokens"] = tok
    L["last"] = last
    return L


def samples_of(path):
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
        out.append((w[at + 3 : at + 3 + n].astype(np.int64).tolist(), int(w[at + 1])))
        at += 3 + n
    return out


# ---------------------------------------------------------------- loss and held-out evaluation
def loss_of(net, target, L, t2d, d2t_dev, kl=1.0):
    logits = net(L)
    tok = L["tokens"]
    lab_tok = tok[L["seq"], L["lab_pos"]]
    lab = t2d[lab_tok]
    keep = lab >= 0
    with torch.no_grad():
        hrow = L["last"][L["seq"], L["lab_pos"] - 1]
        tl = rms(hrow, target.out_norm, target.eps) @ target.head[d2t_dev].T
        logp = F.log_softmax(tl, -1)
    logq = F.log_softmax(logits, -1)
    ce = -logq.gather(1, lab.clamp(min=0)[:, None])[:, 0]
    kld = (logp.exp() * (logp - logq)).sum(-1)
    w = L["weight"] * keep
    loss = ((ce + kl * kld) * w).sum() / w.sum().clamp(min=1e-6)
    d1 = (L["depth"] == 1) & keep
    acc1 = ((logits.argmax(-1) == lab) & d1).sum().item() / max(1, d1.sum().item())
    return loss, acc1, int(keep.sum().item())


@torch.no_grad()
def evaluate(net, target, held, d2t_dev, dev, per_batch=16):
    depths = MASKS + 1
    hits, blocks = np.zeros(depths, np.int64), 0
    for i in range(0, len(held), per_batch):
        seqs, ancs = [], []
        for toks, plen in held[i : i + per_batch]:
            full = [g for g in range(max(plen - 2, 0), len(toks) - 2) if g + 1 + depths < len(toks)]
            if not full:
                continue
            step = max(1, -(-len(full) // 32))
            seqs.append((toks, plen)), ancs.append(full[::step])
        if not seqs:
            continue
        L = batch_inputs(target, seqs, ancs, dev)
        C, N = L["C"], L["N"]
        rows = []
        for s, anc in enumerate(ancs):
            for a, g0 in enumerate(anc):
                rows.append([s * N + g0] + [s * N + C + a * MASKS + j for j in range(MASKS)])
        L["out"] = torch.tensor(rows, device=dev).reshape(-1)
        am = d2t_dev[net(L).argmax(-1)].view(len(rows), depths).cpu().numpy()
        r = 0
        for s, anc in enumerate(ancs):
            toks = seqs[s][0]
            for g0 in anc:
                blocks += 1
                for k in range(depths):
                    if am[r, k] != toks[g0 + 2 + k]:
                        break
                    hits[k] += 1
                r += 1
    acc = hits / max(blocks, 1)
    alpha = [acc[0]] + [acc[k] / acc[k - 1] if acc[k - 1] > 0 else 0.0 for k in range(1, depths)]
    return dict(blocks=int(blocks), alpha=[float(a) for a in alpha], expected_tau=float(1 + acc.sum()))


# ---------------------------------------------------------------- the run
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True, help="the campaign's samples.bin (optionally .gz)")
    ap.add_argument("--n-seed", type=int, default=5131, help="seed samples: the last 5 %% of them are held out")
    ap.add_argument("--drafter", required=True, help="the DART drafter to start from (published layout)")
    ap.add_argument("--state", help="resume weights, EMA and AdamW moments from this .pt when it exists")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=9.0)
    ap.add_argument("--batch-seqs", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=96)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ema", type=float, default=0.99)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-samples", type=int, default=256)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    t_start = time.time()
    dev = torch.device(a.device)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "log.jsonl"), "a")

    def note(**kv):
        kv["wall_s"] = round(time.time() - t_start, 1)
        print(json.dumps(kv), flush=True)
        log.write(json.dumps(kv) + "\n")
        log.flush()

    cfg = json.load(open(os.path.join(a.drafter, "config.json")))
    w0 = read_safetensors(os.path.join(a.drafter, "model.safetensors"))
    d2t_np = w0["d2t"] + np.arange(len(w0["d2t"]))  # offsets → target ids
    d2t = torch.from_numpy(d2t_np).to(dev)
    t2d = torch.full((cfg["vocab_size"],), -1, dtype=torch.long, device=dev)
    t2d[d2t] = torch.arange(len(d2t), device=dev)
    samples = samples_of(a.samples)
    n_seed = a.n_seed
    held_idx = list(range(n_seed - n_seed // 20, n_seed))
    held = [samples[i] for i in held_idx][: a.eval_samples]
    hs = set(held_idx)
    train = [s for i, s in enumerate(samples) if i not in hs and len(s[0]) >= 3 and len(s[0]) - 2 > max(s[1] - 2, 0)]
    note(event="device", name=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", torch=torch.__version__)
    note(event="data", samples=len(samples), train=len(train), held_out=len(held))
    target = Target(a.model, dev)
    note(event="target", layers=target.n_layers, load_s=round(time.time() - t_start, 1))
    w0 = {n: w0[n].astype(np.float32) for n in NAMES} | {k: w0[k] for k in ("d2t", "t2d")}
    net = Drafter({n: w0[n] for n in NAMES}, cfg).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ema = [p.detach().clone() for p in net.parameters()]
    step, positions = 0, 0
    if a.state and os.path.exists(a.state):
        st = torch.load(a.state, map_location=dev, weights_only=False)
        net.load_state_dict(st["net"])
        opt.load_state_dict(st["opt"])
        ema = st["ema"]
        step, positions = st["step"], st["positions"]
        note(event="resumed", step=step, positions=positions)

    def ema_net():
        e = Drafter({n: w0[n] for n in NAMES}, cfg).to(dev)
        with torch.no_grad():
            for p, q in zip(e.parameters(), ema):
                p.copy_(q)
        return e

    def save(final=False):
        if a.state:
            tmp = a.state + ".tmp"
            torch.save(dict(net=net.state_dict(), opt=opt.state_dict(), ema=ema, step=step, positions=positions), tmp)
            os.replace(tmp, a.state)
        st = {k: v.astype(np.float16) for k, v in ema_net().state().items()}
        d = os.path.join(a.out, "drafter")
        os.makedirs(d, exist_ok=True)
        write_safetensors(os.path.join(d, "model.safetensors"), st | {"d2t": w0["d2t"], "t2d": w0["t2d"]})
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        json.dump(dict(step=step, positions=positions), open(os.path.join(a.out, "progress.json"), "w"))

    if step == 0:
        note(event="eval", step=0, positions=0, **evaluate(net, target, held, d2t, dev))
    rng = np.random.default_rng(a.seed + step)
    order, oi = rng.permutation(len(train)), 0
    t_loop, pos_loop = time.time(), positions
    while True:
        # Leave a minute for the last evaluation and save.
        if (a.max_steps and step >= a.max_steps) or time.time() - t_start > a.minutes * 60 - 60:
            break
        seqs, ancs = [], []
        for _ in range(a.batch_seqs):
            if oi == len(order):
                order, oi = rng.permutation(len(train)), 0
            s = train[order[oi]]
            oi += 1
            valid = np.arange(max(s[1] - 2, 0), len(s[0]) - 2)
            k = min(a.anchors, len(valid)) if a.anchors > 0 else len(valid)
            seqs.append(s), ancs.append(sorted(rng.choice(valid, k, replace=False).tolist()))
        L = batch_inputs(target, seqs, ancs, dev)
        lr = a.lr * min(1.0, (step + 1) / max(1, a.warmup))
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        loss, acc1, rows = loss_of(net, target, L, t2d, d2t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(net.parameters(), a.clip)
        opt.step()
        with torch.no_grad():
            for e, p in zip(ema, net.parameters()):
                e.mul_(a.ema).add_(p.detach(), alpha=1 - a.ema)
        step += 1
        positions += rows
        if step % 25 == 0:
            dt = time.time() - t_loop
            note(event="step", step=step, loss=round(loss.item(), 4), acc1=round(acc1, 3), lr=lr, grad_norm=round(gn.item(), 2),
                 positions=positions, pos_per_s=round((positions - pos_loop) / max(dt, 1e-6)))
        if step % a.eval_every == 0:
            note(event="eval", step=step, positions=positions, **evaluate(ema_net(), target, held, d2t, dev))
            save()
    note(event="eval", step=step, positions=positions, final=True, **evaluate(ema_net(), target, held, d2t, dev))
    save(final=True)


if __name__ == "__main__":
    main()
