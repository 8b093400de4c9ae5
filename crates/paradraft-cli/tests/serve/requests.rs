//! Answers equal `generate` under concurrency for every drafter; bad requests get OpenAI errors.

use super::*;

#[test]
fn answers_equal_generate_under_16_concurrent_mixed_requests_for_every_drafter() {
    let cases = cases();
    assert_eq!(cases.len(), 16);
    let drafters: [&[&str]; 4] = [
        &["--drafter", "none"],
        &["--drafter", "pld"],
        &["--drafter", "dflash"],
        &["--drafter", "auto"],
    ];
    for d in drafters {
        let server = Server::start(d);
        let port = server.port;
        // auto a second time: its suffix cache then holds every answer (shared by requests).
        let rounds = if d[1] == "auto" { 2 } else { 1 };
        for _ in 0..rounds {
            for (c, got) in cases.iter().zip(ask_all(port, &cases)) {
                assert_eq!(
                    got, c.want,
                    "{d:?}: chat={} stream={} prompt {:?}",
                    c.chat, c.stream, c.prompt
                );
            }
        }
    }
}

/// A server with a q8_0 KV cache (#64) answers concurrent requests as `generate` with one does:
/// the cache type changes the answers (a little) but not their batch invariance.
#[test]
fn a_q8_0_kv_server_answers_as_generate_with_one_does() {
    let q8 = ["--kv-dtype", "q8_0"];
    let base: Vec<Case> = cases().into_iter().take(8).collect();
    let f16: Vec<_> = base.iter().map(|c| c.want.clone()).collect();
    let cases: Vec<Case> = base
        .into_iter()
        .map(|c| Case {
            want: generate_with(&c.prompt, !c.chat, c.max, c.stop, &q8),
            ..c
        })
        .collect();
    // The cache type reaches `generate`: some answers differ from the f16 cache's.
    assert!(cases.iter().zip(&f16).any(|(c, w)| &c.want != w));
    let server = Server::start(&["--drafter", "auto", "--kv-dtype", "q8_0"]);
    let port = server.port;
    for (c, got) in cases.iter().zip(ask_all(port, &cases)) {
        assert_eq!(got, c.want, "q8_0: chat={} prompt {:?}", c.chat, c.prompt);
    }
}

/// Every case sent at once, one thread each; the answers in the cases' order.
fn ask_all(port: u16, cases: &[Case]) -> Vec<(String, usize)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .iter()
            .map(|c| s.spawn(move || ask(port, c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
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
    // Greedy: a sampled answer (the API's default temperature is 1) may end before its 4
    // tokens (a clean-clone CI run on 2026-12-03 got 3).
    let ok_body =
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}"#;
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
            r#"{"messages": [{"role": "user", "content": "hi"}], "min_p": 1.5}"#.into(),
            chat,
            400,
            "",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}], "n": 17}"#.into(),
            chat,
            400,
            "",
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
        (
            r#"{"prompt": "hi", "speculative": {"num_speculative_tokens": -1}}"#.into(),
            "/v1/completions",
            400,
            "",
        ),
        (
            r#"{"prompt": "hi", "speculative": {"method": "dart"}}"#.into(),
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
    // Processing (#61): out-of-range values and keys are refused naming their field.
    let (cmpl, hi) = ("/v1/completions", r#""prompt": "hi""#);
    let user = r#""messages": [{"role": "user", "content": "hi"}]"#;
    for (path, head, rest, param) in [
        (cmpl, hi, r#""logit_bias": {"abc": 1}"#, "logit_bias"),
        (cmpl, hi, r#""logit_bias": {"99999999": 1}"#, "logit_bias"),
        (cmpl, hi, r#""logit_bias": {"5": 101}"#, "logit_bias"),
        (cmpl, hi, r#""presence_penalty": 2.5"#, "presence_penalty"),
        (cmpl, hi, r#""frequency_penalty": -3"#, "frequency_penalty"),
        (cmpl, hi, r#""repetition_penalty": 0"#, "repetition_penalty"),
        (cmpl, hi, r#""logprobs": 21"#, "logprobs"),
        (chat, user, r#""top_logprobs": 2"#, "top_logprobs"),
        (
            chat,
            user,
            r#""logprobs": true, "top_logprobs": 21"#,
            "top_logprobs",
        ),
        // Tools, and other servers' fields (#61): refused naming the field.
        (
            chat,
            user,
            r#""tools": [{"type": "function", "function": {"name": "a b"}}]"#,
            "tools",
        ),
        (chat, user, r#""tool_choice": "required""#, "tool_choice"),
        (cmpl, hi, r#""mirostat": 2"#, "mirostat"),
        (chat, user, r#""samplers": ["top_k"]"#, "samplers"),
        (cmpl, hi, r#""guided_regex": "(""#, "guided_regex"),
        (cmpl, hi, r#""bogus": 1"#, "bogus"),
        (
            chat,
            user,
            r#""continue_final_message": true, "add_generation_prompt": false"#,
            "continue_final_message",
        ),
        (
            cmpl,
            hi,
            r#""add_generation_prompt": false"#,
            "add_generation_prompt",
        ),
    ] {
        let body = format!("{{{head}, {rest}}}");
        let (st, v) = call(path, &body, &auth);
        assert_eq!(
            (st, &v["error"]["param"]),
            (400, &json!(param)),
            "{body}: {v}"
        );
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
    // Per request (#61): speculation off drafts nothing and answers as with it (T = 0); a cap
    // of 1 verifies at most one draft token a round.
    let echo = r#""messages": [{"role": "user", "content": "Say: red green blue red green blue red green blue"}], "max_tokens": 24, "temperature": 0"#;
    let mut texts = vec![];
    for (spec, most) in [
        ("{}", None),
        (r#"{"enabled": false}"#, Some(0)),
        (r#"{"num_speculative_tokens": 1}"#, Some(1)),
    ] {
        let (st, v) = call(
            chat,
            &format!(r#"{{{echo}, "speculative": {spec}}}"#),
            &auth,
        );
        assert_eq!(st, 200, "{v}");
        let u = &v["usage"]["speculative"];
        let (rounds, drafted) = (
            u["rounds"].as_u64().unwrap(),
            u["drafted_tokens"].as_u64().unwrap(),
        );
        if let Some(m) = most {
            assert!(drafted <= m * rounds, "{spec}: {u}");
        }
        if most == Some(0) {
            assert_eq!(drafted, 0, "{u}");
        }
        texts.push(v["choices"][0]["message"]["content"].clone());
    }
    assert!(texts.iter().all(|t| t == &texts[0]), "{texts:?}");
    let (st, v) = http(port, "GET", "/v1/models", &auth[1..], "");
    assert_eq!(st, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["data"][0]["drafter"], json!("pld"));
    assert!(metric(port, "paradraft_requests_total{outcome=\"finished\"}") >= 1.0);
    // Refused requests are counted too: the bad bodies above and the wrong key.
    let invalid = metric(port, "paradraft_requests_total{outcome=\"invalid\"}");
    assert!(invalid >= (cases.len() - 1 + 9) as f64, "{invalid}");
    assert!(metric(port, "paradraft_requests_total{outcome=\"unauthorized\"}") >= 2.0);
}
