#!/usr/bin/env python3
"""Serving benchmark: aggregate throughput, time to first token and inter-token latency of
`paradraft serve` at several concurrency levels, AR against each drafter, plus the CLI's
single-stream decode speed on the same prompts (the server at concurrency 1 should be within
a few per cent of it).

Standard library only. For each method it starts the server on a free port, sends `requests`
streaming chat requests (first turns of the benchmark sets, temperature 0 unless --temperature)
from `c` client threads at a time, and reads the Prometheus metrics for the acceptance.

    python3 scripts/bench_serve.py --methods none,pld,dflash,dart --concurrency 1,4,16,64

Writes OUT/serve.json, OUT/serve.md and OUT/serve_throughput.svg.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompts(datasets, n):
    """The first turns of the first n records of each set, interleaved."""
    sets = []
    for ds in datasets:
        with open(os.path.join(ROOT, "data", "bench", ds + ".jsonl")) as f:
            sets.append([json.loads(line)["turns"][0] for _, line in zip(range(n), f)])
    return [s[i] for i in range(n) for s in sets if i < len(s)]


class Server:
    def __init__(self, binary, args):
        self.p = subprocess.Popen(
            [binary, "serve", "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        t = time.time()
        for line in self.p.stderr:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
            if time.time() - t > 300:
                raise RuntimeError("server did not start")
        else:
            raise RuntimeError("server exited: " + str(self.p.wait()))
        threading.Thread(target=self.p.stderr.read, daemon=True).start()

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)


class LlamaServer(Server):
    """llama.cpp's llama-server on the same model, threads and prompts (the `llama-server`
    method): one slot per stream of the busiest level, each with the context a paradraft
    request gets."""

    def __init__(self, binary, model, threads, slots, ctx):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.p = subprocess.Popen(
            [binary, "-m", model, "--port", str(self.port), "-t", str(threads), "-tb", str(threads),
             "-np", str(slots), "-c", str(slots * ctx), "--jinja", "--metrics", "-lv", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        t = time.time()
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError("llama-server exited: " + str(self.p.returncode))
            if time.time() - t > 300:
                raise RuntimeError("llama-server did not start")
            time.sleep(0.5)


def sse_events(r):
    """The JSON events of a server-sent-events response."""
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def stream_chat(port, prompt, max_tokens, temperature, seed):
    """One streaming chat request: (t_first, t_last, completion tokens, text). `max_tokens`
    0 leaves it out, as many clients do (the server's default: up to the context)."""
    req = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if max_tokens > 0:
        req["max_tokens"] = max_tokens
    body = json.dumps(req)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]}")
    first = last = None
    tokens, text = 0, []
    for ev in sse_events(r):
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for ch in ev["choices"]:
            piece = ch["delta"].get("content")
            if piece:
                now = time.perf_counter()
                first = first or now
                last = now
                text.append(piece)
    c.close()
    # A server that reports no usage: one token per content chunk (llama-server streams so).
    tokens = tokens or sum(1 for _ in text)
    first = first or time.perf_counter()
    return first - t0, (last or first) - t0, tokens, "".join(text)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def metric_sums(port):
    """(accepted-per-round sum, count, server ITL sum, count, undrafted rounds by reason —
    speed guard, AR probe, cost model —, forward rows, forwards, preemptions, then the engine's
    step seconds by phase: plan, draft_pass, forward, commit) from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    v = [0.0] * 14
    phases = ["plan", "draft_pass", "forward", "commit"]
    keys = [
        "paradraft_accepted_tokens_per_round_sum",
        "paradraft_accepted_tokens_per_round_count",
        "paradraft_inter_token_latency_seconds_sum",
        "paradraft_inter_token_latency_seconds_count",
    ]
    steps = ["paradraft_step_rows_sum", "paradraft_step_rows_count"]
    reasons = ["speed_guard", "probe", "cost_model"]
    for line in text.splitlines():
        for i, k in enumerate(keys):
            if line.startswith(k):
                v[i] += float(line.rsplit(" ", 1)[1])
        if line.startswith("paradraft_undrafted_rounds_total{"):
            for i, r in enumerate(reasons):
                if f'reason="{r}"' in line:
                    v[4 + i] += float(line.rsplit(" ", 1)[1])
        for i, k in enumerate(steps):
            if line.startswith(k):
                v[7 + i] += float(line.rsplit(" ", 1)[1])
        if line.startswith("paradraft_preemptions_total "):
            v[9] += float(line.rsplit(" ", 1)[1])
        if line.startswith("paradraft_step_seconds_total{"):
            for i, ph in enumerate(phases):
                if f'phase="{ph}"' in line:
                    v[10 + i] += float(line.rsplit(" ", 1)[1])
    return v


def level(port, ps, conc, n_req, max_tokens, temperature, first=0):
    results = [None] * n_req
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n_req:
                return
            t = time.perf_counter()
            ttft, tlast, toks, _ = stream_chat(port, ps[first + i], max_tokens, temperature, i)
            results[i] = (t, ttft, tlast, toks)

    a0, n0, i0, m0, *u0 = metric_sums(port)
    t0 = time.perf_counter()
    th = [threading.Thread(target=worker) for _ in range(conc)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.perf_counter() - t0
    a1, n1, i1, m1, *u1 = metric_sums(port)
    toks = sum(r[3] for r in results)
    ttft = [r[1] for r in results]
    itl = [(r[2] - r[1]) / (r[3] - 1) for r in results if r[3] > 1]
    single = [(r[3] - 1) / (r[2] - r[1]) for r in results if r[3] > 1 and r[2] > r[1]]
    return {
        "concurrency": conc,
        "requests": n_req,
        # Speculative rounds that drafted nothing, by reason (speed guard, AR probe, cost
        # model); beside `draft_rounds`, those that drafted.
        "rounds_undrafted": [b - a for a, b in zip(u0[:3], u1[:3])],
        # Forwards the engine ran and their rows (prompt chunks and verify rows).
        "forwards": u1[4] - u0[4],
        "forward_rows": u1[3] - u0[3],
        # Requests preempted for KV pages (each recomputes its tokens when resumed).
        "preemptions": u1[5] - u0[5],
        # The engine's step seconds by phase (plan, draft_pass, forward, commit).
        "step_s": dict(zip(["plan", "draft_pass", "forward", "commit"],
                           [b - a for a, b in zip(u0[6:10], u1[6:10])])),
        "tokens": toks,
        "wall_s": wall,
        "tok_s": toks / wall,
        "ttft_ms": {p: 1e3 * pct(ttft, p) for p in (50, 90, 99)},
        "itl_ms": {p: 1e3 * pct(itl, p) for p in (50, 90, 99)},
        "stream_decode_tok_s_median": statistics.median(single) if single else None,
        "tau": (1 + (a1 - a0) / (n1 - n0)) if n1 > n0 else None,
        "draft_rounds": n1 - n0,
        # Measured by the engine (no client or network in it).
        "server_itl_ms_mean": 1e3 * (i1 - i0) / (m1 - m0) if m1 > m0 else None,
    }


def cli_decode(binary, ps, max_tokens, n):
    """The CLI's decode tok/s (median over n prompts) at temperature 0."""
    rates = []
    for p in ps[:n]:
        out = subprocess.run(
            [binary, "generate", "--prompt", p, "--max-new-tokens", str(max_tokens),
             "--drafter", "none", "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        rates.append(json.loads(out.stdout)["stats"]["decode_tok_s"])
    return statistics.median(rates)


def svg(results, levels, path):
    w, h, m = 560, 340, 50
    ymax = max(r["tok_s"] for res in results.values() for r in res) * 1.1
    xs = {c: m + (w - 2 * m) * i / max(1, len(levels) - 1) for i, c in enumerate(levels)}
    colors = ["#444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
        f'<line x1="{m}" y1="{m / 2}" x2="{m}" y2="{h - m}" stroke="black"/>',
        f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">concurrent streams</text>',
        f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">aggregate tok/s</text>',
    ]
    y = lambda v: h - m - (h - 1.5 * m) * v / ymax
    for c, x in xs.items():
        out.append(f'<text x="{x}" y="{h - m + 15}" text-anchor="middle">{c}</text>')
    for k in range(5):
        v = ymax * k / 4
        out.append(f'<text x="{m - 5}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
    for i, (name, res) in enumerate(results.items()):
        col = colors[i % len(colors)]
        pts = " ".join(f"{xs[r['concurrency']]:.1f},{y(r['tok_s']):.1f}" for r in res)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="2"/>')
        out.append(f'<text x="{m + 10}" y="{m / 2 + 14 * (i + 1)}" fill="{col}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out))


def portable(args):
    """The arguments as a report records them: paths inside the repository relative to it,
    others by file name (a report names no machine's directories)."""
    out = dict(args)
    for k in ("bin", "out", "llama_server", "model"):
        v = out.get(k)
        if v:
            v = os.path.abspath(v)
            out[k] = os.path.relpath(v, ROOT) if v.startswith(ROOT + os.sep) else os.path.basename(v)
    return out


def start(a, method, levels):
    if method == "llama-server":
        model = a.model or subprocess.run([a.bin, "fetch-model"], capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1]
        return LlamaServer(a.llama_server, model, a.threads, max(levels), a.llama_ctx)
    # `METHOD@BIN`: that method served by another build (an A/B of two builds in one run).
    method, _, binary = method.partition("@")
    return Server(binary or a.bin, ["--drafter", method, *a.server_args.split()])


def paired(a, methods, levels, per_level, ps, report):
    """`--rounds R`: every method's server up at once (an idle one takes no CPU), then R rounds
    of every level, each level run by every method in turn on the same new prompts, the order
    reversed every other round (ABBA). The VM's speed drifts by 10-30 % over minutes; a ratio
    of two runs seconds apart, on the same prompts, does not drift with it."""
    servers = {}
    try:
        for m in methods:
            servers[m] = start(a, m, levels)
            stream_chat(servers[m].port, ps[0], 8, a.temperature, 0)  # warm-up
        runs = {m: {c: [] for c in levels} for m in methods}
        first = 1
        for rnd in range(a.rounds):
            order = methods if rnd % 2 == 0 else methods[::-1]
            for c, n in zip(levels, per_level):
                if first + n > len(ps):
                    sys.exit(f"prompts ran out in round {rnd + 1}: use fewer rounds or requests")
                for m in order:
                    r = level(servers[m].port, ps, c, n, a.max_tokens, a.temperature, first)
                    runs[m][c].append(r)
                    print(f"round {rnd + 1} {m:>8} c={c:<3} {r['tok_s']:7.1f} tok/s  "
                          f"tau {r['tau'] or 0:.2f}", flush=True)
                first += n
    finally:
        for srv in servers.values():
            srv.stop()
    base = methods[0]
    lines = [
        f"max_tokens {a.max_tokens}, temperature {a.temperature}, prompts: {a.datasets}; "
        f"{a.rounds} paired rounds (ABBA), each level's prompts new in every round",
        "",
        f"| method | streams | tok/s median (min-max) | / {base} per round | median ratio | τ median "
        "| engine time outside the forward, median |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for m in methods:
        for c in levels:
            rs = runs[m][c]
            ratios = [r["tok_s"] / b["tok_s"] for r, b in zip(rs, runs[base][c])]
            taus = [r["tau"] for r in rs if r["tau"]]
            summary[f"{m}/{c}"] = {"tok_s": [r["tok_s"] for r in rs], "ratio": ratios}
            tok = [r["tok_s"] for r in rs]
            # Planning, drafters' passes and commits, of the engine's step time.
            outside = [1 - r["step_s"]["forward"] / max(1e-9, sum(r["step_s"].values()))
                       for r in rs if r.get("step_s")]
            lines.append(
                f"| {m} | {c} | {statistics.median(tok):.1f} ({min(tok):.1f}-{max(tok):.1f}) | "
                f"{', '.join(f'{x:.3f}' for x in ratios)} | **{statistics.median(ratios):.3f}** | "
                f"{statistics.median(taus) if taus else 0:.2f} | "
                f"{100 * statistics.median(outside) if outside else 0:.1f} % |"
            )
    report["paired"] = {"runs": runs, "summary": summary}
    with open(os.path.join(a.out, "serve.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--methods", default="none,pld,dflash",
                    help="drafters, comma-separated; METHOD@BIN serves one with another build")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="per level (default: max(8, 2c))")
    ap.add_argument("--max-tokens", type=int, default=128, help="0: not sent (up to the context)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--datasets", default="mt_bench,gsm8k_test,humaneval")
    ap.add_argument("--server-args", default="", help="extra `serve` flags, space-separated")
    ap.add_argument("--llama-server", default="", help="llama-server binary (for the `llama-server` method)")
    ap.add_argument("--model", default="", help="the model llama-server loads (default: the one "
                    "`paradraft fetch-model` gives, which the servers under test serve)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-server's threads")
    ap.add_argument("--llama-ctx", type=int, default=2048, help="llama-server's context per slot")
    ap.add_argument("--rounds", type=int, default=0, help="paired rounds: all servers up at "
                    "once, each level run by every method in turn on the same prompts (ABBA)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "serve"))
    a = ap.parse_args()
    levels = [int(c) for c in a.concurrency.split(",")]
    per_level = [a.requests or max(8, 2 * c) for c in levels]
    sets = a.datasets.split(",")
    # The warm-up prompt and every level's own prompts, all distinct (see below).
    need = 1 + max(1, a.rounds) * sum(per_level)
    ps = prompts(sets, max(40, -(-need // len(sets))))
    if len(ps) < need:
        sys.exit(f"{need} distinct prompts needed, the sets {a.datasets} have {len(ps)}")
    os.makedirs(a.out, exist_ok=True)
    report = {"args": portable(vars(a)), "results": {}}
    if a.temperature == 0 and a.max_tokens > 0 and not a.rounds:
        report["cli_decode_tok_s"] = cli_decode(a.bin, ps, a.max_tokens, 8)
        print(f"CLI decode (median of 8 prompts): {report['cli_decode_tok_s']:.1f} tok/s", flush=True)
    methods = a.methods.split(",")
    if a.rounds:
        paired(a, methods, levels, per_level, ps, report)
        return 0
    for method in methods:
        srv = start(a, method, levels)
        try:
            stream_chat(srv.port, ps[0], 8, a.temperature, 0)  # warm-up
            res = []
            # Each level asks prompts no earlier level asked (a drafter that caches earlier
            # answers, as auto's suffix cache does, must not see a prompt twice).
            first = 1
            for c, n in zip(levels, per_level):
                r = level(srv.port, ps, c, n, a.max_tokens, a.temperature, first)
                first += n
                res.append(r)
                print(
                    f"{method:>8} c={c:<3} {r['tok_s']:7.1f} tok/s  TTFT p50 {r['ttft_ms'][50]:7.0f} ms"
                    f"  ITL p50 {r['itl_ms'][50]:6.1f} ms  tau {r['tau'] or 0:.2f}",
                    flush=True,
                )
            report["results"][method] = res
        finally:
            srv.stop()
        with open(os.path.join(a.out, "serve.json"), "w") as f:
            json.dump(report, f, indent=1)
    svg(report["results"], levels, os.path.join(a.out, "serve_throughput.svg"))
    lines = [
        f"max_tokens {a.max_tokens}, temperature {a.temperature}, prompts: {a.datasets}",
        "",
        "| method | streams | tok/s | × c=1 | TTFT p50 / p90 / p99 ms | ITL p50 / p90 / p99 ms | τ of drafted rounds | rounds drafted / held / probed / cut |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, res in report["results"].items():
        base = res[0]["tok_s"]
        for r in res:
            t, i = r["ttft_ms"], r["itl_ms"]
            u = r.get("rounds_undrafted") or [0, 0, 0]
            tau = f"{r['tau']:.2f}" if r["tau"] else "–"
            lines.append(
                f"| {method} | {r['concurrency']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f} | "
                f"{t[50]:.0f} / {t[90]:.0f} / {t[99]:.0f} | {i[50]:.1f} / {i[90]:.1f} / {i[99]:.1f} | "
                f"{tau} | {r.get('draft_rounds', 0):.0f} / {u[0]:.0f} / {u[1]:.0f} / {u[2]:.0f} |"
            )
    if "cli_decode_tok_s" in report:
        r0 = report["results"].get("none", [{}])[0]
        one, itl = r0.get("stream_decode_tok_s_median"), r0.get("server_itl_ms_mean")
        if one and itl:
            lines += [
                "",
                f"AR at one stream: CLI decode {report['cli_decode_tok_s']:.1f} tok/s; server "
                f"{one:.1f} tok/s per stream as the client sees it, {1e3 / itl:.1f} tok/s as the "
                "engine times it (inter-token latency)",
            ]
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
