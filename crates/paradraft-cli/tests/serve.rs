//! `paradraft serve` end to end: the real binary on SmolLM2, driven over loopback with raw
//! HTTP (this file) and with the official `openai` Python package (`openai_client.py`).
//! At T = 0 every answer equals `paradraft generate` for the same prompt, whatever the
//! concurrency and the drafter; errors come back in the OpenAI shape; disconnects cancel.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_paradraft")
}

/// A running server, stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(bin())
            .args(["serve", "--port", "0"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let t = Instant::now();
        let mut line = String::new();
        let port = loop {
            line.clear();
            if err.read_line(&mut line).unwrap() == 0 {
                panic!("serve exited before listening: {:?}", child.wait());
            }
            if let Some(i) = line.find("http://127.0.0.1:") {
                let rest = &line[i + "http://127.0.0.1:".len()..];
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                break digits.parse().unwrap();
            }
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "serve did not start"
            );
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = err.read_to_string(&mut sink);
        });
        Server { child, port }
    }

    fn term(&mut self) -> std::process::ExitStatus {
        // SAFETY: signals our own child process.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.term();
        }
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body, dechunked).
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a header block");
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").expect("a chunk size line");
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (st, b) = http(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    (st, serde_json::from_str(&b).unwrap_or(Value::String(b)))
}

/// A streamed response: the `data:` payloads before `[DONE]`, which must end it.
fn post_stream(port: u16, path: &str, body: &Value) -> Vec<Value> {
    let (st, b) = http(
        port,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body.to_string(),
    );
    assert_eq!(st, 200, "{b}");
    let data: Vec<&str> = b.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{b}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// `paradraft generate` at T = 0: the reference text and token count.
fn generate(prompt: &str, raw: bool, max: usize, stop: Option<&str>) -> (String, usize) {
    let m = max.to_string();
    let mut args = vec![
        "generate",
        "--prompt",
        prompt,
        "--max-new-tokens",
        &m,
        "--json",
    ];
    if raw {
        args.push("--raw");
    }
    if let Some(s) = stop {
        args.extend(["--stop", s]);
    }
    let out = Command::new(bin()).args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["text"].as_str().unwrap().to_string(),
        v["token_ids"].as_array().unwrap().len(),
    )
}

/// One request of the mixed workload and what `generate` says it must answer.
struct Case {
    chat: bool,
    stream: bool,
    prompt: String,
    max: usize,
    stop: Option<&'static str>,
    want: (String, usize),
}

fn cases() -> Vec<Case> {
    let prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers.",
        "def fibonacci(n):",
        "Explain what a compiler does in one sentence.",
        "Translate 'good morning' into Spanish.",
        "The quick brown fox",
        "Give me a tip for learning to code.",
    ];
    let mut out = vec![];
    for (i, p) in prompts.iter().enumerate() {
        for chat in [true, false] {
            let max = [24, 40, 17, 32][i % 4];
            let stop = (i % 3 == 1).then_some(".");
            out.push(Case {
                chat,
                stream: (i + chat as usize).is_multiple_of(2),
                prompt: p.to_string(),
                max,
                stop,
                want: generate(p, !chat, max, stop),
            });
        }
    }
    out
}

/// Sends one case; returns the text and completion tokens the server reported.
fn ask(port: u16, c: &Case) -> (String, usize) {
    let mut body = if c.chat {
        json!({"model": "SmolLM2-135M-Instruct.Q4_1",
               "messages": [{"role": "user", "content": c.prompt}]})
    } else {
        json!({"prompt": c.prompt})
    };
    body["max_tokens"] = json!(c.max);
    body["temperature"] = json!(0);
    if let Some(s) = c.stop {
        body["stop"] = json!([s]);
    }
    let path = if c.chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    if !c.stream {
        let (st, v) = post(port, path, &body);
        assert_eq!(st, 200, "{v}");
        let ch = &v["choices"][0];
        let text = if c.chat {
            ch["message"]["content"].as_str().unwrap().to_string()
        } else {
            ch["text"].as_str().unwrap().to_string()
        };
        let u = &v["usage"];
        assert_eq!(
            u["total_tokens"].as_u64(),
            Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
        );
        return (text, u["completion_tokens"].as_u64().unwrap() as usize);
    }
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = post_stream(port, path, &body);
    let mut text = String::new();
    let mut finish = None;
    for ch in &chunks[..chunks.len() - 1] {
        let c0 = &ch["choices"][0];
        let piece = if c.chat {
            c0["delta"]["content"].as_str()
        } else {
            c0["text"].as_str()
        };
        text.push_str(piece.unwrap_or(""));
        if !c0["finish_reason"].is_null() {
            finish = c0["finish_reason"].as_str().map(String::from);
        }
    }
    assert!(finish.is_some(), "a finish chunk");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    (text, usage["completion_tokens"].as_u64().unwrap() as usize)
}

#[test]
fn answers_equal_generate_under_16_concurrent_mixed_requests_for_every_drafter() {
    let cases = cases();
    assert_eq!(cases.len(), 16);
    let drafters: [&[&str]; 3] = [
        &["--drafter", "none"],
        &["--drafter", "pld"],
        &["--drafter", "dflash"],
    ];
    for d in drafters {
        let server = Server::start(d);
        let port = server.port;
        std::thread::scope(|s| {
            let hs: Vec<_> = cases
                .iter()
                .map(|c| s.spawn(move || ask(port, c)))
                .collect();
            for (c, h) in cases.iter().zip(hs) {
                let got = h.join().unwrap();
                assert_eq!(
                    got, c.want,
                    "{d:?}: chat={} stream={} prompt {:?}",
                    c.chat, c.stream, c.prompt
                );
            }
        });
    }
}

fn metric(port: u16, name: &str) -> f64 {
    let (st, text) = http(port, "GET", "/metrics", &[], "");
    assert_eq!(st, 200);
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_lives_on() {
    let server = Server::start(&[
        "--drafter",
        "pld",
        "--api-key",
        "sk-test",
        "--ctx-size",
        "512",
    ]);
    let port = server.port;
    let auth = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-test"),
    ];
    let call = |path: &str, body: &str, headers: &[(&str, &str)]| {
        let (st, b) = http(port, "POST", path, headers, body);
        (
            st,
            serde_json::from_str::<Value>(&b).unwrap_or(Value::String(b)),
        )
    };
    let chat = "/v1/chat/completions";
    let ok_body = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}"#;
    let long = "word ".repeat(600);
    let cases: Vec<(String, &str, u16, &str)> = vec![
        (ok_body.into(), chat, 401, "invalid_api_key"), // no key (checked below without auth)
        ("{not json".into(), chat, 400, ""),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "foo": 1}"#.into(),
            chat,
            400,
            "",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 3}"#.into(),
            chat,
            400,
            "",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "top_p": 0}"#.into(),
            chat,
            400,
            "",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "n": 2}"#.into(),
            chat,
            400,
            "unsupported_parameter",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}"#.into(),
            chat,
            400,
            "",
        ),
        (r#"{"messages": []}"#.into(), chat, 400, ""),
        (
            r#"{"messages": [{"role": "tool", "content": "x"}]}"#.into(),
            chat,
            400,
            "",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}"#.into(),
            chat,
            404,
            "model_not_found",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "stop": ["a","b","c","d","e"]}"#
                .into(),
            chat,
            400,
            "",
        ),
        (
            format!(r#"{{"messages": [{{"role": "user", "content": "{long}"}}]}}"#),
            chat,
            400,
            "context_length_exceeded",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}"#.into(),
            chat,
            400,
            "context_length_exceeded",
        ),
        (
            r#"{"prompt": "hi", "echo": true}"#.into(),
            "/v1/completions",
            400,
            "unsupported_parameter",
        ),
        (
            r#"{"prompt": ["a", "b"]}"#.into(),
            "/v1/completions",
            400,
            "unsupported_parameter",
        ),
        (
            r#"{"prompt": [999999999]}"#.into(),
            "/v1/completions",
            400,
            "",
        ),
        (r#"{"prompt": ""}"#.into(), "/v1/completions", 400, ""),
        (
            r#"{"prompt": "hi", "stream_options": {"include_usage": true}}"#.into(),
            "/v1/completions",
            400,
            "",
        ),
    ];
    for (i, (body, path, want, code)) in cases.iter().enumerate() {
        let headers: &[(&str, &str)] = if i == 0 { &auth[..1] } else { &auth };
        let (st, v) = call(path, body, headers);
        assert_eq!(st, *want, "{body:.80}: {v}");
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        if !code.is_empty() {
            assert_eq!(e["code"], json!(code), "{v}");
        }
    }
    let (st, v) = call(chat, ok_body, &[("Authorization", "Bearer wrong"), auth[0]]);
    assert_eq!((st, &v["error"]["code"]), (401, &json!("invalid_api_key")));
    let (st, _) = http(port, "GET", "/nope", &[], "");
    assert_eq!(st, 404);
    // /health and /metrics need no key; the server still answers properly.
    assert_eq!(http(port, "GET", "/health", &[], "").0, 200);
    let (st, v) = call(chat, ok_body, &auth);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], json!(4));
    assert_eq!(v["choices"][0]["finish_reason"], json!("length"));
    let (st, v) = http(port, "GET", "/v1/models", &auth[1..], "");
    assert_eq!(st, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["data"][0]["drafter"], json!("pld"));
    assert!(metric(port, "paradraft_requests_total{outcome=\"finished\"}") >= 1.0);
    // Refused requests are counted too: the bad bodies above and the wrong key.
    let invalid = metric(port, "paradraft_requests_total{outcome=\"invalid\"}");
    assert!(invalid >= (cases.len() - 1) as f64, "{invalid}");
    assert!(metric(port, "paradraft_requests_total{outcome=\"unauthorized\"}") >= 2.0);
}

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
        .args(["-c", "import openai"])
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
            .arg("openai")
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
    let want = json!({
        "chat": generate("Name a color.", false, 20, None).0,
        "chat_stop": generate("Count from 1 to 10, separated by commas.", false, 40, Some(",")).0,
        "completion": generate("The capital of Italy is", true, 12, None).0,
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
