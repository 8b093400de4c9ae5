#!/usr/bin/env python3
"""Serving with a long shared system prompt (#64): time to first token of a request whose
prefix is cached against the same request cold, then a burst of concurrent streams that share
the system prompt through a KV pool far smaller than their runs would take unshared, with the
server's resident memory sampled throughout and every answer checked against the same request
served alone afterwards.

Standard library only; reuses bench_serve.py's server wrapper. Temperature 0.

    python3 scripts/bench_shared_prefix.py --streams 64 --kv-memory-mib 1024

Writes OUT/summary.json and OUT/summary.md.
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import ROOT, Server, sse_events  # noqa: E402


def records(name):
    with open(os.path.join(ROOT, "data", "bench", name + ".jsonl")) as f:
        return [json.loads(line)["turns"][0] for line in f]


def text_of(items, chars):
    """Items joined as numbered examples until about `chars` characters."""
    out, n = [], 0
    for i, t in enumerate(items):
        if n >= chars:
            break
        out.append(f"Example {i + 1}: {t}")
        n += len(out[-1])
    return "\n".join(out)


def chat(port, system, user, max_tokens, timeout=900):
    """One streamed chat request: (status, text, ttft seconds, usage)."""
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return r.status, r.read().decode(), None, None
    text, ttft, usage = "", None, None
    for ev in sse_events(r):
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += piece
    c.close()
    return 200, text, ttft, usage


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "paradraft"))
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--system-chars", type=int, default=4000, help="≈ 4 characters a token")
    ap.add_argument("--user-chars", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-memory-mib", type=int, default=1024)
    ap.add_argument("--ttft-pairs", type=int, default=5)
    ap.add_argument("--server-args", default="")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-out", "shared-prefix"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    gsm, mt, he = records("gsm8k_test"), records("mt_bench"), records("humaneval")
    system = "You answer questions. Worked examples follow.\n" + text_of(gsm, a.system_chars)
    users = []
    for i in range(a.streams):
        pool = mt[i % len(mt):] + he[(3 * i) % len(he):]
        users.append(f"Context {i}:\n" + text_of(pool, a.user_chars) + f"\nQuestion {i}: {gsm[-1 - i]}")
    args = ["--kv-memory-mib", str(a.kv_memory_mib), *a.server_args.split()]
    srv = Server(a.bin, args)
    port, pid = srv.port, srv.p.pid
    res = {"streams": a.streams, "kv_memory_mib": a.kv_memory_mib, "server_args": args}
    try:
        idle = rss_mib(pid)
        # 1. TTFT: a request with a system prompt never seen (cold), then another question under
        # the same system prompt (its prefix cached).
        cold, hit = [], []
        for k in range(a.ttft_pairs):
            s = f"Session {k}. " + system
            st, _, t, _ = chat(port, s, gsm[k], 8)
            assert st == 200
            cold.append(t)
            st, _, t, _ = chat(port, s, gsm[100 + k], 8)
            assert st == 200
            hit.append(t)
        res["ttft_cold_ms"] = [round(1000 * t, 1) for t in cold]
        res["ttft_hit_ms"] = [round(1000 * t, 1) for t in hit]
        res["ttft_hit_over_cold_median"] = round(statistics.median(hit) / statistics.median(cold), 3)
        # 2. The burst: every stream at once, memory sampled.
        peak, stop = [rss_mib(pid)], threading.Event()

        def sample():
            while not stop.is_set():
                peak.append(rss_mib(pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        got = [None] * a.streams

        def one(i):
            got[i] = chat(port, system, users[i], a.max_tokens)

        t0 = time.perf_counter()
        th = [threading.Thread(target=one, args=(i,)) for i in range(a.streams)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        m = metrics(port)
        ok = [g for g in got if g[0] == 200]
        res["burst"] = {
            "completed": len(ok),
            "refused": a.streams - len(ok),
            "statuses": sorted({g[0] for g in got}),
            "wall_s": round(wall, 1),
            "prompt_tokens_median": statistics.median(g[3]["prompt_tokens"] for g in ok) if ok else None,
            "ttft_p50_s": round(statistics.median(g[2] for g in ok if g[2]), 2) if ok else None,
            "rss_idle_mib": round(idle),
            "rss_peak_mib": round(max(peak)),
            "prefix_hits": m.get("paradraft_prefix_cache_hits_total"),
            "prefix_hit_tokens": m.get("paradraft_prefix_cache_hit_tokens_total"),
            "prefix_evictions": m.get("paradraft_prefix_cache_evictions_total"),
            "kv_pages_total": m.get("paradraft_kv_pages_total"),
        }
        # 3. Each answer again, alone.
        same = 0
        for i in range(a.streams):
            st, text, _, _ = chat(port, system, users[i], a.max_tokens)
            same += st == 200 and got[i][0] == 200 and text == got[i][1]
        res["burst"]["equal_to_alone"] = same
        res["rss_after_mib"] = round(rss_mib(pid))
    finally:
        srv.stop()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(res, f, indent=1)
    b = res["burst"]
    md = (
        f"# Shared system prompt, {a.streams} streams, --kv-memory-mib {a.kv_memory_mib}\n\n"
        f"`python3 scripts/bench_shared_prefix.py {' '.join(sys.argv[1:])}`\n\n"
        f"- TTFT cold / prefix cached (ms): {res['ttft_cold_ms']} / {res['ttft_hit_ms']}; "
        f"median ratio {res['ttft_hit_over_cold_median']}\n"
        f"- burst: {b['completed']} completed, {b['refused']} refused (statuses {b['statuses']}), "
        f"{b['equal_to_alone']} equal to the request alone; {b['prompt_tokens_median']} prompt "
        f"tokens (median); wall {b['wall_s']} s; TTFT p50 {b['ttft_p50_s']} s\n"
        f"- prefix cache: {b['prefix_hits']:.0f} hits, {b['prefix_hit_tokens']:.0f} tokens, "
        f"{b['prefix_evictions']:.0f} evictions; pool {b['kv_pages_total']:.0f} pages\n"
        f"- RSS: idle {b['rss_idle_mib']} MiB, peak {b['rss_peak_mib']} MiB, after {res['rss_after_mib']} MiB\n"
    )
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
