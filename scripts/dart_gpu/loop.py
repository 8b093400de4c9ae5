"""What the GPU trainers of DART (train.py here) and DFlash (../dflash_gpu/train.py) share: the
run's log, and the optimiser with its moving average of the weights and resumable state
(AdamW 0.9 / 0.999 / 1e-8 without decay and global clipping, as `train::optim`)."""
import argparse
import json
import os
import time

import torch


class Log:
    """`log(event=..., **fields)`: one JSON line to stdout and to OUT/log.jsonl (appended), with
    the seconds since `t_start`."""

    def __init__(self, out, t_start):
        os.makedirs(out, exist_ok=True)
        self.f = open(os.path.join(out, "log.jsonl"), "a")
        self.t_start = t_start

    def __call__(self, **kv):
        kv["wall_s"] = round(time.time() - self.t_start, 1)
        print(json.dumps(kv), flush=True)
        self.f.write(json.dumps(kv) + "\n")
        self.f.flush()

    def device(self, dev):
        self(event="device", name=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", torch=torch.__version__)


class Optimised:
    """`net` under AdamW at `lr` with gradients clipped to `clip` and a moving average (`decay`)
    of its weights; resumed from `state` (a .pt) when that exists. `make_net()` builds a fresh
    network of the same shape (for the average's copy)."""

    def __init__(self, net, make_net, lr, decay, clip, state, dev, log):
        self.net, self.make_net, self.decay, self.clip, self.state, self.dev = net, make_net, decay, clip, state, dev
        self.opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self.ema = [p.detach().clone() for p in net.parameters()]
        self.step, self.positions = 0, 0
        if state and os.path.exists(state):
            st = torch.load(state, map_location=dev, weights_only=False)
            net.load_state_dict(st["net"])
            self.opt.load_state_dict(st["opt"])
            self.ema = st["ema"]
            self.step, self.positions = st["step"], st["positions"]
            log(event="resumed", step=self.step, positions=self.positions)

    def update(self, loss, lr, positions):
        """One optimiser step on `loss` at `lr` that trained `positions`; the gradient norm."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.clip)
        self.opt.step()
        with torch.no_grad():
            for e, p in zip(self.ema, self.net.parameters()):
                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
        self.step += 1
        self.positions += positions
        return gn.item()

    def ema_net(self):
        """A network holding the moving average."""
        e = self.make_net().to(self.dev)
        with torch.no_grad():
            for p, q in zip(e.parameters(), self.ema):
                p.copy_(q)
        return e

    def save_state(self):
        if self.state:
            tmp = self.state + ".tmp"
            torch.save(
                dict(net=self.net.state_dict(), opt=self.opt.state_dict(), ema=self.ema, step=self.step, positions=self.positions), tmp
            )
            os.replace(tmp, self.state)


class Pools:
    """The greedy training samples and the sampled (teacher-labelled) ones, each drawn in a
    fresh seeded permutation per pass; `draw()` takes a sampled one with probability `share`."""

    def __init__(self, greedy, sampled, share, rng):
        self.rng, self.share = rng, share
        self.pools = {False: [greedy, rng.permutation(len(greedy)), 0], True: [sampled, rng.permutation(len(sampled)), 0]}

    def draw(self):
        """A sample and whether it is sampled text."""
        t = bool(self.pools[True][0]) and self.rng.random() < self.share
        pool = self.pools[t]
        if pool[2] == len(pool[1]):
            pool[1], pool[2] = self.rng.permutation(len(pool[0])), 0
        s = pool[0][pool[1][pool[2]]]
        pool[2] += 1
        return s, t


def arguments(doc, method):
    """The options both trainers take (the run's files, resumption, sampled text, device); each
    adds its own recipe's."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True, help="the campaign's samples.bin (optionally .gz)")
    ap.add_argument("--n-seed", type=int, default=5131, help="seed samples: the last 5 %% of them are held out")
    ap.add_argument("--drafter", required=True, help=f"the {method} drafter to start from (published layout)")
    ap.add_argument("--sampled", help="sampled answers (a token file, .gz read compressed), labelled by the target")
    ap.add_argument("--sampled-share", type=float, help="share of sequences drawn from --sampled (default: by count)")
    ap.add_argument("--state", help="resume weights, EMA and AdamW moments from this .pt when it exists")
    ap.add_argument("--out", required=True)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    return ap
