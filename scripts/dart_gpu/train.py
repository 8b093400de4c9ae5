#!/usr/bin/env python3
"""THE DART campaign's objective on a lent GPU (PyTorch; the device machines have no Rust).

The same network, data and loss as `paradraft train campaign` (crates/paradraft/src/train/dart,
train/campaign): the target's taps (outputs of layers 1, 14, 26) and its distribution over the
draft vocabulary are computed inside each step from token sequences (online teacher forcing,
here with the GGUF weights dequantised to bf16 instead of the engine's int8 kernels); the
drafter sees the prefix-shared layout (every clean slot of a sequence, then blocks of 7 mask
slots for sampled prefixes); the loss is the label's cross-entropy plus the KL from the target's
draft-vocabulary distribution, weighted gamma^(depth-1); AdamW (0.9, 0.999, 1e-8, no decay),
global gradient clipping, an EMA of the weights. The greedy self-distilled samples are labelled by
their own tokens; sampled text (`--sampled`, grown on the GPU by `--generate`: training prompts
answered again at `--gen-temp`) is labelled by the target's argmax, its mask rows trained only
along the target's greedy chain, as the campaign does. The held-out split is the campaign's (the
last 5 % of the seed samples) and the held-out chain evaluation is `dart::evaluate`'s.

Nothing here is the product: it reads/writes numpy files that `scripts/dart_gpu/prepare.py`
It starts from a drafter in the published layout and writes one (EMA weights, f16, the same
d2t/t2d) that `paradraft train campaign --from` takes back (docs/dart_campaign.md, "A lent GPU"); the Rust
held-out evaluation of that drafter is what counts.

  python3 train.py --model M.gguf --samples samples.bin.gz --n-seed 5131 --drafter DIR --out OUT
                   [--minutes 9] [--state S.pt] [--sampled S.bin [--generate N] [--sampled-share X]]
"""
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from loop import Log, Optimised, Pools, arguments
from target import Target, append_samples, read_safetensors, rms, samples_of, write_safetensors

MASKS = 7
GAMMA = 0.6


# ---------------------------------------------------------------- the drafter (train/dart/net.rs)
NAMES = [
    "fc.weight", "midlayer.mask_rep", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "norm.weight", "lm_head.weight",
]


LAYER = [
    "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


def names(cfg):
    """Every trainable tensor of a drafter of `num_hidden_layers` layers (`Net::shapes`): the
    paper's one, then plain LLaMA layers `layers.{i}.*`."""
    return NAMES + [f"layers.{i}.{n}" for i in range(1, cfg["num_hidden_layers"]) for n in LAYER]


class Drafter(torch.nn.Module):
    def __init__(self, w, cfg):
        super().__init__()
        self.names = names(cfg)
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(torch.from_numpy(w[n]).float()) for n in self.names})
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.eps, self.layers = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["num_hidden_layers"]
        hd, theta = self.hd, cfg["rope_theta"]
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd).float())

    def w(self, n):
        return self.p[n.replace(".", "__")]

    def state(self):
        return {n: self.w(n).detach().float().cpu().numpy() for n in self.names}

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
        x = torch.cat([g.float(), rep[:h].expand(B, A7, h)], 1)
        ang = b["pos"].float()[..., None] * self.inv_freq  # [B, N, hd/2]
        cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]

        def rope(x):  # rotate-half, as graph::rope
            x1, x2 = x[..., : hd // 2].float(), x[..., hd // 2 :].float()
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(torch.bfloat16)

        for li in range(self.layers):
            p = (lambda s: m(s)) if li == 0 else (lambda s, li=li: self.w(f"layers.{li}.{s}"))
            if li > 0:
                u = rms(x, p("input_layernorm.weight"), self.eps)
            ub = u.to(torch.bfloat16)
            q = (ub @ p("self_attn.q_proj.weight").T.to(torch.bfloat16)).view(B, N, nh, hd)
            k = (ub @ p("self_attn.k_proj.weight").T.to(torch.bfloat16)).view(B, N, nkv, hd)
            v = (ub @ p("self_attn.v_proj.weight").T.to(torch.bfloat16)).view(B, N, nkv, hd)
            q, k = rope(q), rope(k)
            k = k.repeat_interleave(nh // nkv, dim=2)
            v = v.repeat_interleave(nh // nkv, dim=2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=b["mask"][:, None])
            o = a.transpose(1, 2).reshape(B, N, nh * hd)
            x = x + (o @ p("self_attn.o_proj.weight").T.to(torch.bfloat16)).float()
            if li + 1 == self.layers:  # rows are independent from here on: the scored ones go on
                x = x.reshape(B * N, h)[b["out"]]
            xn = rms(x, p("post_attention_layernorm.weight"), self.eps).to(torch.bfloat16)
            gate = F.silu(xn @ p("mlp.gate_proj.weight").T.to(torch.bfloat16))
            up = xn @ p("mlp.up_proj.weight").T.to(torch.bfloat16)
            x = x + ((gate * up) @ p("mlp.down_proj.weight").T.to(torch.bfloat16)).float()
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
    C = max(len(x[0]) for x in seqs) - 1
    A = max(1, max(len(a) for a in anchors))
    N = C + A * MASKS
    pos = np.zeros((B, N), np.int64)
    qg = np.zeros((B, N), np.int64)  # the last clean key each slot sees
    blk = np.full((B, N), -1, np.int64)  # a mask slot's block
    jj = np.zeros((B, N), np.int64)  # a mask slot's index in its block (1..7)
    out, lab_pos, depth, weight, seq_of = [], [], [], [], []
    for s, ((toks, plen, *_), anc) in enumerate(zip(seqs, anchors)):
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


def batch_inputs(target, seqs, anchors, dev, teacher=None):
    """Runs the target over the sequences and fills the drafter's inputs; `teacher[s]`: sequence
    s is labelled by the target (sampled text), not by its own tokens."""
    L = layout(seqs, anchors, dev)
    T = L["C"] + 1
    L["teacher"] = torch.tensor(teacher or [False] * len(seqs), device=dev)
    tok = torch.zeros((len(seqs), T), dtype=torch.long)
    for s, (t, *_) in enumerate(seqs):
        tok[s, : len(t)] = torch.tensor(t)
    tok = tok.to(dev)
    taps, last = target.forward(tok)
    L["feat"] = taps[:, : T - 1]
    L["next_emb"] = target.emb[tok[:, 1:]]
    L["tokens"] = tok
    L["last"] = last
    return L


# ---------------------------------------------------------------- loss and held-out evaluation
def loss_of(net, target, L, t2d, d2t_dev, kl=1.0):
    """`dart::sequences_loss`: a self-distilled row's label is its own token; a teacher row's is
    the target's argmax over the draft vocabulary, and a teacher mask row is trained only where
    every token between its prefix and its label is the target's argmax (`Labeled::chain_weights`)."""
    logits = net(L)
    tok, seq, lp = L["tokens"], L["seq"], L["lab_pos"]
    lab = t2d[tok[seq, lp]]
    with torch.no_grad():
        head = target.head[d2t_dev]
        hrow = L["last"][seq, lp - 1]
        tl = rms(hrow, target.out_norm, target.eps) @ head.T
        logp = F.log_softmax(tl, -1)
        teach = L["teacher"][seq]
        keep = lab >= 0
        if bool(teach.any()):
            am = (rms(L["last"], target.out_norm, target.eps) @ head.T).argmax(-1)  # [B, T]
            greedy = torch.zeros_like(tok, dtype=torch.bool)
            greedy[:, 1:] = t2d[tok[:, 1:]] == am[:, :-1]
            off = torch.cumsum((~greedy).long(), 1)
            lo = lp - L["depth"] + 1  # the chain is lo..lp-1 (empty at depth 1)
            chain_ok = off[seq, lp - 1] == off[seq, lo - 1]
            lab = torch.where(teach, tl.argmax(-1), lab)
            keep = torch.where(teach, chain_ok, lab >= 0)
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
        for toks, plen, *_ in held[i : i + per_batch]:
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
def grow_sampled(a, target, train, note):
    """Appends up to `a.generate` sampled answers to `a.sampled`: training prompts in a fixed
    seeded order, continuing after the answers the file already has, one seed per batch."""
    if not a.sampled:
        raise SystemExit("--generate needs --sampled FILE")
    have = len(samples_of(a.sampled)) if os.path.exists(a.sampled) else 0
    order = np.random.default_rng(0x5A4D).permutation(len(train))
    t0, made = time.time(), 0
    stop = {target.eos} | target.stop_ids
    while made < a.generate and time.time() - t0 < a.gen_minutes * 60:
        k = have + made
        batch = [train[order[(k + i) % len(train)]] for i in range(min(a.gen_batch, a.generate - made))]
        prompts = [s[0][: s[1]] for s in batch]
        outs = target.generate(prompts, a.gen_max_new, a.gen_temp, stop, seed=a.seed * 1_000_003 + k)
        append_samples(a.sampled, [(p + o, len(p), s[2]) for p, o, s in zip(prompts, outs, batch) if len(o) >= 2])
        made += len(batch)
        note(event="generated", answers=made, tokens=sum(len(o) for o in outs), secs=round(time.time() - t0, 1))


def main():
    ap = arguments(__doc__, "DART")
    ap.add_argument("--generate", type=int, default=0, help="first answer this many training prompts again, sampled")
    ap.add_argument("--gen-temp", type=float, default=0.8)
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--gen-max-new", type=int, default=256)
    ap.add_argument("--gen-minutes", type=float, default=3.0, help="stop generating after this long")
    ap.add_argument("--minutes", type=float, default=9.0)
    ap.add_argument("--batch-seqs", type=int, default=16)
    ap.add_argument("--anchors", type=int, default=96)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--ema", type=float, default=0.99)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-samples", type=int, default=256)
    a = ap.parse_args()
    t_start = time.time()
    dev = torch.device(a.device)
    note = Log(a.out, t_start)

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
    usable = lambda s: len(s[0]) >= 3 and len(s[0]) - 2 > max(s[1] - 2, 0)
    train = [s for i, s in enumerate(samples) if i not in hs and usable(s)]
    note.device(dev)
    note(event="data", samples=len(samples), train=len(train), held_out=len(held))
    target = Target(a.model, dev)
    note(event="target", layers=target.n_layers, load_s=round(time.time() - t_start, 1))
    if a.generate > 0:
        grow_sampled(a, target, train, note)
    sampled = [s for s in samples_of(a.sampled) if usable(s)] if a.sampled and os.path.exists(a.sampled) else []
    share = a.sampled_share if a.sampled_share is not None else len(sampled) / max(1, len(sampled) + len(train))
    note(event="sampled", sequences=len(sampled), share=round(share, 3))
    w0 = {n: w0[n].astype(np.float32) for n in names(cfg)} | {k: w0[k] for k in ("d2t", "t2d")}
    net = Drafter(w0, cfg).to(dev)
    run = Optimised(net, lambda: Drafter(w0, cfg), a.lr, a.ema, a.clip, a.state, dev, note)

    def save():
        run.save_state()
        st = {k: v.astype(np.float16) for k, v in run.ema_net().state().items()}
        d = os.path.join(a.out, "drafter")
        os.makedirs(d, exist_ok=True)
        write_safetensors(os.path.join(d, "model.safetensors"), st | {"d2t": w0["d2t"], "t2d": w0["t2d"]})
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        json.dump(dict(step=run.step, positions=run.positions), open(os.path.join(a.out, "progress.json"), "w"))

    if run.step == 0:
        note(event="eval", step=0, positions=0, **evaluate(net, target, held, d2t, dev))
    rng = np.random.default_rng(a.seed + run.step)
    pools = Pools(train, sampled, share, rng)
    t_loop, pos_loop = time.time(), run.positions
    while True:
        # Leave a minute for the last evaluation and save.
        if (a.max_steps and run.step >= a.max_steps) or time.time() - t_start > a.minutes * 60 - 60:
            break
        seqs, ancs, teach = [], [], []
        for _ in range(a.batch_seqs):
            s, t = pools.draw()
            teach.append(t)
            valid = np.arange(max(s[1] - 2, 0), len(s[0]) - 2)
            k = min(a.anchors, len(valid)) if a.anchors > 0 else len(valid)
            seqs.append(s), ancs.append(sorted(rng.choice(valid, k, replace=False).tolist()))
        L = batch_inputs(target, seqs, ancs, dev, teach)
        lr = a.lr * min(1.0, (run.step + 1) / max(1, a.warmup))
        loss, acc1, rows = loss_of(net, target, L, t2d, d2t)
        gn = run.update(loss, lr, rows)
        if run.step % 25 == 0:
            dt = time.time() - t_loop
            note(event="step", step=run.step, loss=round(loss.item(), 4), acc1=round(acc1, 3), lr=lr, grad_norm=round(gn, 2),
                 positions=run.positions, pos_per_s=round((run.positions - pos_loop) / max(dt, 1e-6)))
        if run.step % a.eval_every == 0:
            note(event="eval", step=run.step, positions=run.positions, **evaluate(run.ema_net(), target, held, d2t, dev))
            save()
    note(event="eval", step=run.step, positions=run.positions, final=True, **evaluate(run.ema_net(), target, held, d2t, dev))
    save()


if __name__ == "__main__":
    main()
