import json, subprocess, sys, time, urllib.request
B, drafter, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
srv = subprocess.Popen([B, "serve", "--threads", "2", "--drafter", drafter, "--port", str(port)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
def ask(prompt):
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 200, "temperature": 0}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})))
    return time.time() - t, r["usage"]["completion_tokens"], r["choices"][0]["message"]["content"]
for _ in range(100):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health"); break
    except Exception: time.sleep(0.3)
prompts = ["Explain how a hash table works, with an example in Python.", "Write a short story about a lighthouse keeper who finds a message in a bottle."]
for p in prompts:
    for i in range(3):
        dt, n, text = ask(p)
        print(f"{drafter} prompt{prompts.index(p)} try{i}: {n} tokens in {dt*1000:.0f} ms = {n/dt:.1f} tok/s")
srv.terminate(); srv.wait()
