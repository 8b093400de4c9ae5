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
    generate_with(prompt, raw, max, stop, &[])
}

/// [`generate`] with more flags.
fn generate_with(
    prompt: &str,
    raw: bool,
    max: usize,
    stop: Option<&str>,
    extra: &[&str],
) -> (String, usize) {
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
    args.extend(extra);
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
        check_spec_usage(u);
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
    check_spec_usage(usage);
    (text, usage["completion_tokens"].as_u64().unwrap() as usize)
}

/// The request's own speculation in `usage.speculative` (#61): accepted ≤ drafted, τ equal to
/// rounds plus accepted over rounds, and the completion no longer than the prompt's token plus
/// what the rounds committed (a stop can cut the last round short).
fn check_spec_usage(u: &Value) {
    let sp = &u["speculative"];
    let n = |k: &str| sp[k].as_u64().unwrap_or_else(|| panic!("{k} in {u}"));
    let (rounds, drafted, accepted) = (n("rounds"), n("drafted_tokens"), n("accepted_tokens"));
    let tau = sp["tau"].as_f64().unwrap();
    assert!(accepted <= drafted, "{u}");
    if rounds > 0 {
        let want = (rounds + accepted) as f64 / rounds as f64;
        assert!((tau - want).abs() < 1e-3, "{u}");
    }
    assert!(
        u["completion_tokens"].as_u64().unwrap() <= 1 + rounds + accepted,
        "{u}"
    );
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

mod lifecycle;
mod requests;
