//! Disconnects, queue caps, SIGTERM, the official `openai` client, and load with misbehaving clients.

use super::*;

/// A streaming request read for a few chunks and then abandoned.
fn abandon_stream(port: u16, max_tokens: usize) {
    let body = json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": true,
                      "temperature": 0.7});
    let body = body.to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 2048];
    let mut seen = 0;
    while seen < 3 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen += String::from_utf8_lossy(&buf[..n]).matches("data: ").count();
    }
    drop(s);
}

fn wait_for(port: u16, what: &str, ok: impl Fn(f64) -> bool) {
    let t = Instant::now();
    while !ok(metric(port, what)) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what} = {}",
            metric(port, what)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn disconnects_cancel_queues_cap_and_sigterm_drains() {
    let mut server = Server::start(&["--drafter", "pld", "--max-running", "1", "--max-queue", "1"]);
    let port = server.port;
    // A client that goes away cancels its request and frees its pages.
    abandon_stream(port, 4000);
    wait_for(
        port,
        "paradraft_requests_total{outcome=\"cancelled\"}",
        |v| v >= 1.0,
    );
    wait_for(port, "paradraft_kv_pages_used", |v| v == 0.0);
    // One running, one queued: the third is refused with 429.
    let long = json!({"prompt": "Count to one thousand:", "max_tokens": 300, "temperature": 0});
    std::thread::scope(|s| {
        let a = s.spawn(|| post(port, "/v1/completions", &long));
        wait_for(port, "paradraft_running_requests", |v| v == 1.0);
        let b = s.spawn(|| post(port, "/v1/completions", &long));
        wait_for(port, "paradraft_queue_depth", |v| v == 1.0);
        let (st, v) = post(port, "/v1/completions", &long);
        assert_eq!(st, 429, "{v}");
        assert_eq!(v["error"]["code"], json!("too_many_requests"));
        assert_eq!(a.join().unwrap().0, 200);
        assert_eq!(b.join().unwrap().0, 200);
    });
    // SIGTERM with a stream in flight: the stream completes, then the server exits cleanly.
    let body = json!({"prompt": "Hello", "max_tokens": 60, "stream": true, "temperature": 0});
    std::thread::scope(|s| {
        let h = s.spawn(|| post_stream(port, "/v1/completions", &body));
        wait_for(port, "paradraft_running_requests", |v| v == 1.0);
        let st = server.term();
        assert!(st.success(), "{st:?}");
        let chunks = h.join().unwrap();
        let last = &chunks[chunks.len() - 1]["choices"][0];
        assert!(last["finish_reason"].is_string(), "{last}");
    });
}

fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// Installs the `openai` package from PyPI into the target directory (once).
fn openai_pythonpath() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/pydeps");
    let probe = Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .env("PYTHONPATH", &dir)
        .status()
        .unwrap();
    if !probe.success() {
        let st = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-conflicts",
                "--target",
            ])
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .arg(&dir)
            .args(["openai", "jsonschema"])
            .status()
            .unwrap();
        assert!(st.success(), "pip install openai failed");
    }
    dir
}

#[test]
fn the_official_openai_python_client_works() {
    let pydeps = openai_pythonpath();
    let server = Server::start(&["--drafter", "pld", "--api-key", "sk-py"]);
    // Bias, penalties and log-probabilities (#61), as `generate` gives them without a server.
    let processed = |raw: bool| {
        let mut args = vec![
            "generate",
            "--prompt",
            "Name three colors.",
            "--max-new-tokens",
            "24",
            "--presence-penalty",
            "1",
            "--frequency-penalty",
            "0.5",
            "--repetition-penalty",
            "1.2",
            "--logit-bias",
            "2382=-100",
            "--logprobs",
            "3",
            "--json",
        ];
        if raw {
            args.push("--raw");
        }
        let out = Command::new(bin()).args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // Structured output (#61): a JSON schema through `generate`, the server's answer must equal it.
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "indoor": {"type": "boolean"},
        },
        "required": ["name", "age", "indoor"],
        "additionalProperties": false,
    });
    let schema_text = schema.to_string();
    let structured = {
        let out = Command::new(bin())
            .args([
                "generate",
                "--prompt",
                "Describe a cat as JSON.",
                "--max-new-tokens",
                "80",
                "--json-schema",
                &schema_text,
                "--json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let want = json!({
        "schema": schema,
        "structured": structured["text"],
        "chat": generate("Name a color.", false, 20, None).0,
        "chat_stop": generate("Count from 1 to 10, separated by commas.", false, 40, Some(",")).0,
        "completion": generate("The capital of Italy is", true, 12, None).0,
        "processed_chat": processed(false),
        "processed_completion": processed(true),
    });
    let out = Command::new("python3")
        .arg(scripts_dir().join("openai_client.py"))
        .arg(format!("http://127.0.0.1:{}/v1", server.port))
        .arg(want.to_string())
        .env("PYTHONPATH", &pydeps)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// 64 concurrent clients, three requests each: most stream and must get exactly the text the
/// same prompt gets alone, one in eight disconnects mid-stream, one in eight sends malformed
/// JSON. `/health` answers throughout; afterwards nothing is left running and the memory is
/// back near its idle level.
#[test]
fn load_with_disconnects_and_malformed_requests() {
    let server = Server::start(&["--drafter", "pld"]);
    let port = server.port;
    let prompts = [
        "Name three fruits.",
        "What is 7 times 8?",
        "Write one sentence about rain.",
        "def add(a, b):",
        "Who wrote Hamlet?",
        "Give a synonym for happy.",
        "What color is the sky?",
        "Say something kind.",
    ];
    let body = |p: &str| {
        json!({"messages": [{"role": "user", "content": p}], "max_tokens": 48,
                                "temperature": 0})
    };
    // References, one request at a time.
    let want: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (st, v) = post(port, "/v1/chat/completions", &body(p));
            assert_eq!(st, 200, "{v}");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(server.child.id());
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let health = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(http(port, "GET", "/health", &[], "").0, 200);
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "/health took {:?}",
                    t.elapsed()
                );
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            n
        });
        let clients: Vec<_> = (0..64)
            .map(|i| {
                let (want, body, prompts) = (&want, &body, &prompts);
                s.spawn(move || {
                    for k in 0..3 {
                        let j = (i + k) % 8;
                        match (i * 3 + k) % 8 {
                            0 => {
                                let (st, b) = http(
                                    port,
                                    "POST",
                                    "/v1/chat/completions",
                                    &[("Content-Type", "application/json")],
                                    "{\"messages\": [",
                                );
                                assert_eq!(st, 400, "{b}");
                            }
                            1 => abandon_stream(port, 4000),
                            _ => {
                                let mut b = body(prompts[j]);
                                b["stream"] = json!(true);
                                let chunks = post_stream(port, "/v1/chat/completions", &b);
                                let text: String = chunks
                                    .iter()
                                    .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                                    .collect();
                                assert_eq!(text, want[j], "client {i} request {k}");
                            }
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(health.join().unwrap() > 0);
    });
    wait_for(port, "paradraft_running_requests", |v| v == 0.0);
    wait_for(port, "paradraft_kv_pages_used", |v| v == 0.0);
    wait_for(port, "paradraft_queue_depth", |v| v == 0.0);
    assert!(metric(port, "paradraft_requests_total{outcome=\"cancelled\"}") >= 20.0);
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(server.child.id());
    eprintln!("RSS idle {idle} KiB, after the load {after} KiB");
    assert!(
        after < idle + 64 * 1024,
        "memory did not return to its idle level: {idle} KiB before, {after} KiB after"
    );
}
