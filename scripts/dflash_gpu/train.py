#!/usr/bin/env python3
"""The DFlash campaign's objective on a lent GPU (PyTorch; the device machines have no Rust).

The same network, batches and loss as `paradraft train campaign --method dflash`
(crates/paradraft/src/train/dflash): the target's taps (outputs of the drafter's
`target_layer_ids`) and its last-layer outputs are computed inside each step from the token
sequences (online teacher forcing, the GGUF dequantised to bf16 by ../dart_gpu/target.py instead
of the engine's int8 kernels). Each sequence gets random anchors a in its response; block
[x_a, MASK × (B − 1)] sits at positions a..a+B−1, attends bidirectionally within itself and to the
fused context features of positions < a (`dflash::net`, `dflash::batch::build`); slot k is
labelled x_{a+k} (response tokens in the draft vocabulary only) with weight exp(−(k − 1)/γ); the
loss is that label's cross-entropy plus `--kl` × KL(target ‖ drafter) over the draft vocabulary
(`fused::cross_entropy_kl`). AdamW (0.9, 0.999, 1e-8, no decay), global clipping, a moving
average of the weights (what is evaluated and exported). The held-out split is the campaign's
(the last 5 % of the `--n-seed` seed samples) and the evaluation is `dflash::evaluate`'s (up to 32
evenly spaced anchors per held-out sample whose whole block lies in the sample; accepted prefix
of the block's argmax chain).

The weights come back in the published layout (f16, the start drafter's `d2t`), which the
runtime loads and `paradraft train campaign --method dflash --from DIR` evaluates; that
evaluation is what counts (docs/dflash.md, "A lent GPU").

  python3 train.py --model M.gguf --samples samples.bin.gz --drafter DIR --out OUT
                   [--sampled sampled.bin.gz [--sampled-share X]] [--minutes 7] [--state S.pt] [--max-steps N]
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dart_gpu"))
from loop import Log, Optimised, Pools, arguments  # noqa: E402
from target import Target, read_safetensors, rms, samples_of, write_safetensors  # noqa: E402

EVAL_ANCHORS = 32  # campaign::student::EVAL_ANCHORS

LAYER = [
    "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
]


def names(cfg):
    """Every trainable tensor (`dflash::net::Net::shapes`)."""
    return ["fc.weight", "hidden_norm.weight", "norm.weight"] + [
        f"layers.{i}.{n}" for i in range(cfg["num_hidden_layers"]) for n in LAYER
    ]


class Drafter(torch.nn.Module):
    """`dflash::net::Net`: fused context features → per-layer context K/V; block slots attend to
    the context before their anchor and bidirectionally to their own block."""

    def __init__(self, w, cfg):
        super().__init__()
        self.names = names(cfg)
        self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(torch.as_tensor(w[n]).float()) for n in self.names})
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.h, self.eps, self.layers = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["num_hidden_layers"]
        hd, theta = self.hd, cfg["rope_theta"]
        self.register_buffer("inv_freq", (1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float())

    def w(self, n):
        return self.p[n.replace(".", "__")]

    def lin(self, x, n):
        return x.to(torch.bfloat16) @ self.w(n).T.to(torch.bfloat16)

    def state(self):
        return {n: self.w(n).detach().float().cpu().numpy() for n in self.names}

    def rope(self, x, pos):
        """Rotate-half RoPE (`graph::rope`) on `[B, n, heads, hd]` at positions `[B, n]`."""
        ang = pos.float()[..., None] * self.inv_freq
        cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
        half = self.hd // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, b):
        """Final-normed hidden states of every block slot `[B, A·bs, h]`."""
        feat, x, mask = b["feat"], b["block_x"], b["mask"]
        B, C = feat.shape[:2]
        N = x.shape[1]
        nh, nkv, hd, eps = self.nh, self.nkv, self.hd, self.eps
        rep = nh // nkv
        ctx = rms(self.lin(feat, "fc.weight").float(), self.w("hidden_norm.weight"), eps)
        ctx_pos = torch.arange(C, device=feat.device)[None].expand(B, C)
        for i in range(self.layers):
            n = lambda s: f"layers.{i}.{s}.weight"
            ck = self.rope(rms(self.lin(ctx, n("self_attn.k_proj")).float().view(B, C, nkv, hd), self.w(n("self_attn.k_norm")), eps), ctx_pos)
            cv = self.lin(ctx, n("self_attn.v_proj")).view(B, C, nkv, hd)
            xn = rms(x, self.w(n("input_layernorm")), eps)
            q = self.rope(rms(self.lin(xn, n("self_attn.q_proj")).float().view(B, N, nh, hd), self.w(n("self_attn.q_norm")), eps), b["pos"])
            bk = self.rope(rms(self.lin(xn, n("self_attn.k_proj")).float().view(B, N, nkv, hd), self.w(n("self_attn.k_norm")), eps), b["pos"])
            bv = self.lin(xn, n("self_attn.v_proj")).view(B, N, nkv, hd)
            k = torch.cat([ck, bk], 1).to(torch.bfloat16).repeat_interleave(rep, dim=2)
            v = torch.cat([cv, bv], 1).to(torch.bfloat16).repeat_interleave(rep, dim=2)
            a = F.scaled_dot_product_attention(q.to(torch.bfloat16).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None])
            x = x + self.lin(a.transpose(1, 2).reshape(B, N, nh * hd), n("self_attn.o_proj")).float()
            xn = rms(x, self.w(n("post_attention_layernorm")), eps)
            g = F.silu(self.lin(xn, n("mlp.gate_proj")))
            u = self.lin(xn, n("mlp.up_proj"))
            x = x + self.lin(g * u, n("mlp.down_proj")).float()
        return rms(x, self.w("norm.weight"), eps)


# ---------------------------------------------------------------- batches (`dflash::batch::build`)
def batch_inputs(target, cfg, seqs, anchors, dev, taps, teacher=None):
    """The drafter's inputs for sequences `seqs` ((tokens, prompt length, …)) with their sorted
    anchors (lists, possibly of different lengths), plus every slot's label position;
    `teacher[s]`: sequence s is sampled text, labelled by the target."""
    bs, mask_id = cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    B = len(seqs)
    A = max(1, max(len(a) for a in anchors))
    T = max(len(s[0]) for s in seqs)
    tok = torch.zeros((B, T), dtype=torch.long)
    lens = torch.tensor([len(s[0]) for s in seqs])
    plen = torch.tensor([s[1] for s in seqs])
    anc = torch.full((B, A), -1, dtype=torch.long)
    for s, ((t, *_), a) in enumerate(zip(seqs, anchors)):
        tok[s, : len(t)] = torch.tensor(t)
        anc[s, : len(a)] = torch.tensor(a, dtype=torch.long)
    tok, lens, plen, anc = tok.to(dev), lens.to(dev), plen.to(dev), anc.to(dev)
    C = max(1, int(anc.max().item()))  # context slots 0..C-1: the latest anchor sees those before it
    feats, last = target.forward(tok, taps)
    k = torch.arange(bs, device=dev)
    pos = anc.clamp(min=0)[..., None] + k  # [B, A, bs]
    first = torch.where(anc >= 0, tok.gather(1, anc.clamp(min=0)), torch.full_like(anc, mask_id))
    ids = torch.cat([first[..., None], torch.full((B, A, bs - 1), mask_id, device=dev)], -1)
    block_x = target.emb[ids].view(B, A * bs, -1)
    # Keys: the context slots (visible before the query's anchor), then every block slot
    # (visible within the query's own block). A padding block sees its own slots only.
    qa = anc[..., None].expand(B, A, bs).reshape(B, A * bs)
    ctx_vis = torch.arange(C, device=dev)[None, None] < qa[..., None]
    blk = torch.arange(A, device=dev).repeat_interleave(bs)
    blk_vis = (blk[None, :, None] == blk[None, None, :]).expand(B, A * bs, A * bs)
    mask = torch.cat([ctx_vis, blk_vis], -1)
    return dict(
        feat=feats[:, :C], block_x=block_x, pos=pos.view(B, A * bs), mask=mask, tokens=tok, lens=lens, plen=plen,
        anchors=anc, last=last, A=A, bs=bs, teacher=torch.tensor(teacher or [False] * B, device=dev),
    )


def rows_of(L, t2d, gamma, target=None, head=None):
    """The labelled slots (`build`'s weights > 0): flat slot index, sequence, label position,
    label, weight, slot − 1. Sampled text (`L["teacher"]`) is labelled as `Labeled::relabel`
    does: slot k's label is the target's argmax after x_{a+k−1}, kept only while
    x_{a+1}..x_{a+k−1} are each the target's argmax."""
    anc, tok, bs, A = L["anchors"], L["tokens"], L["bs"], L["A"]
    B, T = tok.shape
    k = torch.arange(1, bs, device=tok.device)
    p = anc[..., None] + k  # [B, A, bs-1]
    pc = p.clamp(0, T - 1)
    lab = t2d[tok.gather(1, pc.view(B, -1)).view(p.shape)]
    inside = (anc[..., None] >= 0) & (p < L["lens"][:, None, None]) & (p >= L["plen"][:, None, None])
    ok = inside & (lab >= 0)
    teach = L["teacher"]
    if bool(teach.any()):
        with torch.no_grad():
            am = (rms(L["last"], target.out_norm, target.eps) @ head.T).argmax(-1)  # [B, T] draft ids
            greedy = torch.zeros_like(tok, dtype=torch.bool)
            greedy[:, 1:] = t2d[tok[:, 1:]] == am[:, :-1]
            off = torch.cumsum((~greedy).long(), 1)  # tokens off the target's path in 0..q
            at = lambda idx: off.gather(1, idx.reshape(B, -1)).view(p.shape)
            prev = (pc - 1).clamp(min=0)
            on_path = at(prev) == at(anc.clamp(min=0)[..., None].expand_as(p))
            t = teach[:, None, None]
            lab = torch.where(t, am.gather(1, prev.reshape(B, -1)).view(p.shape), lab)
            ok = torch.where(t, inside & on_path, ok)
    s, j, kk = ok.nonzero(as_tuple=True)
    slot = s * (A * bs) + j * bs + kk + 1
    w = torch.exp(-kk.float() / gamma)
    return slot, s, p[s, j, kk], lab[s, j, kk], w, kk


def loss_of(net, target, L, t2d, head, gamma, kl):
    hidden = net(L)
    slot, s, p, lab, w, kk = rows_of(L, t2d, gamma, target, head)
    h = hidden.reshape(-1, hidden.shape[-1])[slot]
    logits = h.to(torch.bfloat16) @ head.T.to(torch.bfloat16)
    logq = F.log_softmax(logits.float(), -1)
    ce = -logq.gather(1, lab[:, None])[:, 0]
    loss_rows = ce
    if kl > 0:
        with torch.no_grad():
            tl = rms(L["last"][s, p - 1], target.out_norm, target.eps) @ head.T
            logp = F.log_softmax(tl, -1)
        loss_rows = ce + kl * (logp.exp() * (logp - logq)).sum(-1)
    loss = (loss_rows * w).sum() / w.sum().clamp(min=1e-6)
    first = kk == 0
    acc1 = ((logits.argmax(-1) == lab) & first).sum().item() / max(1, int(first.sum().item()))
    return loss, acc1, int(slot.numel())


@torch.no_grad()
def evaluate(net, target, cfg, held, d2t, dev, taps, per_batch=32):
    """`dflash::evaluate`: per held-out sample up to 32 evenly spaced anchors whose block lies in
    the sample; how long a prefix of each block's argmax chain equals the sample's tokens."""
    bs = cfg["block_size"]
    hits, blocks = np.zeros(bs - 1, np.int64), 0
    for i in range(0, len(held), per_batch):
        seqs, ancs = [], []
        for s in held[i : i + per_batch]:
            toks, plen = s[0], s[1]
            full = [a for a in range(plen, max(plen, len(toks) - 1)) if a + bs - 1 < len(toks)]
            if not full:
                continue
            step = max(1, -(-len(full) // EVAL_ANCHORS))
            seqs.append(s), ancs.append(full[::step])
        if not seqs:
            continue
        L = batch_inputs(target, cfg, seqs, ancs, dev, taps)
        hidden = net(L)
        am = d2t[(hidden.to(torch.bfloat16) @ target_head(target, d2t).T.to(torch.bfloat16)).argmax(-1)].cpu().numpy()
        for s, anc in enumerate(ancs):
            toks = seqs[s][0]
            for j, a in enumerate(anc):
                blocks += 1
                for k in range(1, bs):
                    if am[s, j * bs + k] != toks[a + k]:
                        break
                    hits[k - 1] += 1
    acc = hits / max(blocks, 1)
    alpha = [acc[0]] + [acc[k] / acc[k - 1] if acc[k - 1] > 0 else 0.0 for k in range(1, bs - 1)]
    return dict(blocks=int(blocks), acc=[round(float(a), 5) for a in acc], alpha1=round(float(acc[0]), 5), expected_tau=round(float(1 + acc.sum()), 4),
                alpha=[round(float(a), 4) for a in alpha])


_HEADS = {}


def target_head(target, d2t):
    """The target's head rows of the draft vocabulary (frozen; `dflash::frozen_head`)."""
    key = id(d2t)
    if key not in _HEADS:
        _HEADS[key] = target.head[d2t].contiguous()
    return _HEADS[key]


# ---------------------------------------------------------------- the run
def main():
    ap = arguments(__doc__, "DFlash")
    ap.add_argument("--minutes", type=float, default=7.0, help="wall-clock budget, evaluation and save included")
    ap.add_argument("--batch-seqs", type=int, default=32)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--lr-floor", type=float, default=0.1, help="cosine decay over the run's time to this share of --lr")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--kl", type=float, default=1.0)
    ap.add_argument("--ema", type=float, default=0.995)
    ap.add_argument("--eval-every", type=int, default=400)
    ap.add_argument("--eval-samples", type=int, default=0, help="held-out samples evaluated (0: all)")
    ap.add_argument("--train-limit", type=int, default=0, help="use only this many training samples (a dry run)")
    a = ap.parse_args()
    t_start = time.time()
    dev = torch.device(a.device)
    note = Log(a.out, t_start)
    cfg = json.load(open(os.path.join(a.drafter, "config.json")))
    taps = tuple(cfg["dflash_config"]["target_layer_ids"])
    w0 = read_safetensors(os.path.join(a.drafter, "model.safetensors"))
    if "d2t" not in w0:
        raise SystemExit("the drafter has no d2t: this script trains reduced-vocabulary drafters only")
    d2t = torch.from_numpy(w0["d2t"] + np.arange(len(w0["d2t"]))).to(dev)  # offsets → target ids
    t2d = torch.full((cfg["vocab_size"],), -1, dtype=torch.long, device=dev)
    t2d[d2t] = torch.arange(len(d2t), device=dev)
    samples = samples_of(a.samples)
    held_idx = range(a.n_seed - a.n_seed // 20, a.n_seed)
    held = [samples[i] for i in held_idx]
    if a.eval_samples:
        held = held[: a.eval_samples]
    hs = set(held_idx)
    usable = lambda s: len(s[0]) - 1 > s[1]  # at least one valid anchor
    train = [s for i, s in enumerate(samples) if i not in hs and usable(s)]
    if a.train_limit:
        train = train[: a.train_limit]
    held_prompts = {s[2] for s in held}
    sampled = [s for s in samples_of(a.sampled) if usable(s) and s[2] not in held_prompts] if a.sampled else []
    if a.train_limit:
        sampled = sampled[: a.train_limit]
    share = a.sampled_share if a.sampled_share is not None else len(sampled) / max(1, len(sampled) + len(train))
    note.device(dev)
    note(event="data", samples=len(samples), train=len(train), held_out=len(held), sampled=len(sampled), sampled_share=round(share, 3))
    target = Target(a.model, dev)
    if target.h != cfg["hidden_size"] or target.n_layers != cfg["num_target_layers"]:
        raise SystemExit(f"the drafter is for a {cfg['num_target_layers']}-layer target of hidden {cfg['hidden_size']}, not this one")
    note(event="target", layers=target.n_layers, load_s=round(time.time() - t_start, 1))
    head = target_head(target, d2t)
    w0f = {n: w0[n].astype(np.float32) for n in names(cfg)}
    net = Drafter(w0f, cfg).to(dev)
    run = Optimised(net, lambda: Drafter(w0f, cfg), a.lr, a.ema, a.clip, a.state, dev, note)
    best = [(-1.0, 0.0)]

    def save(ev):
        run.save_state()
        # The exported drafter is the best moving average by held-out α1 (then expected τ) so far.
        if (ev["alpha1"], ev["expected_tau"]) <= best[0]:
            return
        best[0] = (ev["alpha1"], ev["expected_tau"])
        st = {k: v.astype(np.float16) for k, v in run.ema_net().state().items()}
        d = os.path.join(a.out, "drafter")
        os.makedirs(d, exist_ok=True)
        write_safetensors(os.path.join(d, "model.safetensors"), st | {"d2t": w0["d2t"].astype(np.int64)})
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        json.dump(dict(step=run.step, positions=run.positions, **ev), open(os.path.join(a.out, "best.json"), "w"))

    t0 = time.time()
    ev = evaluate(run.ema_net(), target, cfg, held, d2t, dev, taps)
    one_eval = time.time() - t0
    note(event="eval", step=run.step, positions=run.positions, eval_s=round(one_eval, 1), **ev)
    best[0] = (ev["alpha1"], ev["expected_tau"])  # the start is the bar to beat
    rng = np.random.default_rng(a.seed + run.step)
    pools = Pools(train, sampled, share, rng)
    t_loop, pos_loop, eval_s = time.time(), run.positions, 0.0
    budget = a.minutes * 60
    while True:
        elapsed = time.time() - t_start
        # Leave room for the last evaluation and save (the first one's time, doubled).
        if (a.max_steps and run.step >= a.max_steps) or elapsed > budget - max(20.0, 2 * one_eval + 10):
            break
        seqs, ancs, teach = [], [], []
        for _ in range(a.batch_seqs):
            s, t = pools.draw()
            teach.append(t)
            valid = np.arange(s[1], len(s[0]) - 1)
            k = min(a.anchors, len(valid))
            seqs.append(s), ancs.append(sorted(rng.choice(valid, k, replace=False).tolist()))
        L = batch_inputs(target, cfg, seqs, ancs, dev, taps, teach)
        frac = min(1.0, (time.time() - t_loop) / max(1.0, budget - (t_loop - t_start)))
        lr = a.lr * min(1.0, (run.step + 1) / max(1, a.warmup)) * (a.lr_floor + (1 - a.lr_floor) * 0.5 * (1 + math.cos(math.pi * frac)))
        loss, acc1, rows = loss_of(net, target, L, t2d, head, a.gamma, a.kl)
        gn = run.update(loss, lr, rows)
        if run.step % 25 == 0:
            dt = time.time() - t_loop - eval_s
            note(event="step", step=run.step, loss=round(loss.item(), 4), acc1=round(acc1, 3), lr=round(lr, 7), grad_norm=round(gn, 3),
                 positions=run.positions, pos_per_s=round((run.positions - pos_loop) / max(dt, 1e-6)))
        if run.step % a.eval_every == 0:
            t0 = time.time()
            ev = evaluate(run.ema_net(), target, cfg, held, d2t, dev, taps)
            note(event="eval", step=run.step, positions=run.positions, **ev)
            save(ev)
            eval_s += time.time() - t0
    ev = evaluate(run.ema_net(), target, cfg, held, d2t, dev, taps)
    note(event="eval", step=run.step, positions=run.positions, final=True, **ev)
    save(ev)

if __name__ == "__main__":
    main()
