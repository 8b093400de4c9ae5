use super::*;
use crate::grammar::{Constraint, GrammarEnv};
use crate::model::tokenizer::tiny_fixture;
use crate::model::ChatEnd;

fn weather() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        }, "required": ["city", "unit"], "additionalProperties": false}
    }}, {"type": "function", "function": {"name": "now"}}])
}

fn tools(format: Format, choice: Value, parallel: Option<bool>) -> Tools {
    Tools::of_request(&Some(weather()), &Some(choice), parallel, format)
        .unwrap()
        .unwrap()
}

/// Whether the constraint accepts `text` whole (every token along it allowed, then a stop).
fn accepts(tok: &Tokenizer, c: &mut Constraint, text: &str) -> bool {
    let vocab = tok.vocab_size();
    let ids = tok.encode(text).unwrap();
    let mut row = vec![0.0f32; vocab];
    if !c.mask(&mut row, &ids) {
        return false;
    }
    let stop = *tok.stop_tokens.iter().next().unwrap();
    row[stop.idx()].is_finite()
}

#[test]
fn formats_follow_the_template() {
    assert_eq!(Format::of(None), Format::Generic);
    assert_eq!(
        Format::of(Some("{% for m in messages %}{{ m.content }}{% endfor %}")),
        Format::Generic
    );
    assert_eq!(
        Format::of(Some("{% if tools %}<tool_call>{% endif %}")),
        Format::Hermes
    );
    assert_eq!(
        Format::of(Some(
            "{% if tools %}{\"name\": …, \"parameters\": …}{% endif %}"
        )),
        Format::Llama3
    );
    assert_eq!(
        Format::of(Some(
            "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
        )),
        Format::Mistral(None)
    );
    // Mistral's templates take only 9-letter-and-digit ids; others keep OpenAI's shape.
    let id = Format::Mistral(None).call_id("abc", 0, 1);
    assert!(
        id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
        "{id}"
    );
    assert_ne!(id, Format::Mistral(None).call_id("abc", 0, 2));
    assert_eq!(Format::Hermes.call_id("abc", 1, 2), "call_abc0102");
}

/// Mistral: a required call is its control token, then a JSON array of calls of the offered
/// tools (one unless more are allowed); a reply that is such an array reads as calls (the
/// token itself is not in the text), anything else as content.
#[test]
fn mistral_calls_follow_their_token() {
    let tok = tiny_fixture();
    let env = GrammarEnv::new(&tok, tok.vocab_size()).unwrap();
    // The tiny vocabulary has no [TOOL_CALLS]: another control token stands in for it.
    let token = tok.token_id("<|im_start|>").unwrap();
    let t = tools(Format::Mistral(Some(token)), json!("required"), None);
    let g = t.grammar().unwrap();
    let paris = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;
    let now = r#"{"name": "now", "arguments": {}}"#;
    for (text, ok) in [
        (format!("<|im_start|>[{paris}]"), true),
        (format!("<|im_start|> [{now}]"), true),
        (format!("[{paris}]"), false),
        (format!("<|im_start|>[{paris}, {now}]"), false),
        ("<|im_start|>[]".to_string(), false),
    ] {
        assert_eq!(
            accepts(&tok, &mut env.constraint(&g).unwrap(), &text),
            ok,
            "{text}"
        );
    }
    let f = Format::Mistral(None);
    let p = read(f, &format!(" [{paris}, {now}]"));
    assert_eq!((p.content, p.calls.len()), (None, 2));
    assert_eq!(p.calls[1].name, "now");
    let p = read(f, "[1, 2] are numbers");
    assert_eq!(p.content.as_deref(), Some("[1, 2] are numbers"));
    let mut r = Reader::new(f);
    assert_eq!(r.push("Sunny"), "Sunny");
    assert_eq!(r.push(" today"), " today");
    let mut r = Reader::new(f);
    assert_eq!(r.push(" [{\"name\""), "");
    r.push(": \"now\", \"arguments\": {}}]");
    assert_eq!(r.finish().calls.len(), 1);
}

#[test]
fn bad_tools_and_choices_name_their_field() {
    let f = Format::Generic;
    let field = |tools: Value, choice: Option<Value>| {
        Tools::of_request(&Some(tools), &choice, None, f)
            .unwrap_err()
            .param
            .map(String::from)
    };
    let one = |func: Value| json!([{"type": "function", "function": func}]);
    assert_eq!(field(json!({"a": 1}), None), Some("tools".into()));
    assert_eq!(field(json!([{"type": "code"}]), None), Some("tools".into()));
    assert_eq!(
        field(one(json!({"name": "a b"})), None),
        Some("tools".into())
    );
    assert_eq!(
        field(one(json!({"name": "a", "parameters": "x"})), None),
        Some("tools".into())
    );
    assert_eq!(
        field(
            json!([{"type": "function", "function": {"name": "a"}},
                   {"type": "function", "function": {"name": "a"}}]),
            None
        ),
        Some("tools".into())
    );
    assert_eq!(
        field(
            weather(),
            Some(json!({"type": "function", "function": {"name": "nope"}}))
        ),
        Some("tool_choice".into())
    );
    assert_eq!(
        field(weather(), Some(json!("sometimes"))),
        Some("tool_choice".into())
    );
    assert_eq!(
        field(json!([]), Some(json!("required"))),
        Some("tool_choice".into())
    );
    // No tools, or `none`: nothing to do.
    assert!(Tools::of_request(&None, &None, None, f).unwrap().is_none());
    assert!(
        Tools::of_request(&Some(weather()), &Some(json!("none")), None, f)
            .unwrap()
            .is_none()
    );
    // A tool without parameters takes an empty object.
    let t = tools(f, json!("auto"), None);
    assert_eq!(
        t.defs[1]["function"]["parameters"],
        json!({"type": "object", "properties": {}})
    );
}

/// Each format's grammar accepts its calls of the offered tools with valid arguments, and
/// nothing else: a required call cannot be skipped, a named tool cannot be swapped, one call
/// unless the request allows more.
#[test]
fn grammars_hold_replies_to_valid_calls() {
    let tok = tiny_fixture();
    let env = GrammarEnv::new(&tok, tok.vocab_size()).unwrap();
    let check = |t: &Tools, good: &[&str], bad: &[&str]| {
        let g = t.grammar().unwrap();
        for s in good {
            assert!(accepts(&tok, &mut env.constraint(&g).unwrap(), s), "{s}");
        }
        for s in bad {
            assert!(!accepts(&tok, &mut env.constraint(&g).unwrap(), s), "{s}");
        }
    };
    let paris = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;
    let now = r#"{"name": "now", "arguments": {}}"#;
    let bad_unit = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}"#;
    let g = Format::Generic;
    check(
        &tools(g, json!("required"), None),
        &[&format!(r#"{{"tool_calls": [{paris}]}}"#)],
        &[
            &format!(r#"{{"tool_calls": [{bad_unit}]}}"#),
            &format!(r#"{{"tool_calls": [{paris}, {now}]}}"#),
            r#"{"response": "hi"}"#,
            r#"{"tool_calls": []}"#,
        ],
    );
    check(
        &tools(g, json!("auto"), Some(true)),
        &[
            &format!(r#"{{"tool_calls": [{paris}, {now}]}}"#),
            r#"{"response": "It is \"sunny\"."}"#,
        ],
        &["It is sunny."],
    );
    let h = Format::Hermes;
    assert!(tools(h, json!("auto"), None).grammar().is_none());
    check(
        &tools(
            h,
            json!({"type": "function", "function": {"name": "get_weather"}}),
            None,
        ),
        &[&format!("<tool_call>\n{paris}\n</tool_call>")],
        &[
            &format!("<tool_call>\n{now}\n</tool_call>"),
            &format!("Sure. <tool_call>\n{paris}\n</tool_call>"),
        ],
    );
    check(
        &tools(h, json!("required"), Some(true)),
        &[&format!(
            "<tool_call>\n{paris}\n</tool_call>\n<tool_call>\n{now}\n</tool_call>"
        )],
        &[""],
    );
    check(
        &tools(Format::Llama3, json!("required"), None),
        &[r#"{"name": "now", "parameters": {}}"#],
        &[now],
    );
}

/// A tool whose parameters refer into themselves (`$defs` and `#` pointers, as pydantic
/// writes them) keeps its meaning once embedded in the call schema, in every format.
#[test]
fn parameters_with_local_refs_stay_valid() {
    let tok = tiny_fixture();
    let env = GrammarEnv::new(&tok, tok.vocab_size()).unwrap();
    let defs = json!([{"type": "function", "function": {
        "name": "convert",
        "parameters": {
            "$defs": {"Unit": {"enum": ["c", "f"]}},
            "type": "object",
            "properties": {
                "unit": {"$ref": "#/$defs/Unit"},
                "also": {"$ref": "#/properties/unit"}
            },
            "required": ["unit", "also"],
            "additionalProperties": false
        }
    }}]);
    let good = r#"{"name": "convert", "ARGS": {"unit": "c", "also": "f"}}"#;
    let bad = r#"{"name": "convert", "ARGS": {"unit": "c", "also": "k"}}"#;
    for (format, wrap) in [
        (Format::Generic, "{\"tool_calls\": [CALL]}"),
        (Format::Hermes, "<tool_call>\nCALL\n</tool_call>"),
        (Format::Llama3, "CALL"),
    ] {
        let t = Tools::of_request(&Some(defs.clone()), &Some(json!("required")), None, format)
            .unwrap()
            .unwrap();
        let g = t.grammar().unwrap();
        let text = |call: &str| wrap.replace("CALL", &call.replace("ARGS", format.arguments_key()));
        assert!(
            accepts(&tok, &mut env.constraint(&g).unwrap(), &text(good)),
            "{format:?}"
        );
        assert!(
            !accepts(&tok, &mut env.constraint(&g).unwrap(), &text(bad)),
            "{format:?}"
        );
    }
}

#[test]
fn replies_read_in_each_format() {
    let call = |n: &str, a: &str| Call {
        name: n.into(),
        arguments: a.into(),
    };
    let text = |s: &str| Parsed {
        content: Some(s.into()),
        calls: vec![],
    };
    let h = Format::Hermes;
    assert_eq!(
        read(
            h,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": \"{}\"}"
        ),
        Parsed {
            content: Some("Let me check.\n".into()),
            calls: vec![call("get_weather", r#"{"city":"Paris"}"#), call("now", "{}")],
        }
    );
    assert_eq!(read(h, "Plain text."), text("Plain text."));
    // A call that is not JSON leaves the text as it was.
    let broken = "<tool_call>\n{\"name\": \"now\", \n</tool_call>";
    assert_eq!(read(h, broken), text(broken));
    let l = Format::Llama3;
    assert_eq!(
        read(l, " {\"name\": \"now\", \"parameters\": {\"tz\": \"UTC\"}}"),
        Parsed {
            content: None,
            calls: vec![call("now", r#"{"tz":"UTC"}"#)],
        }
    );
    assert_eq!(read(l, "{ not a call"), text("{ not a call"));
    let g = Format::Generic;
    assert_eq!(
        read(g, r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#),
        Parsed {
            content: None,
            calls: vec![call("now", "{}")],
        }
    );
    assert_eq!(read(g, r#"{"response": "a \"b\"\n"}"#), text("a \"b\"\n"));
    // Cut short inside the answer: what it had said.
    assert_eq!(read(g, r#"{"response": "half a sent"#), text("half a sent"));
    assert_eq!(read(g, r#"{"response": "x\u00"#), text("x"));
}

/// Streamed in pieces of any size, a reply sends content that is a prefix of what reading it
/// whole gives, and the rest at the end, with the same calls.
#[test]
fn streamed_replies_equal_whole_ones() {
    let cases = [
        (Format::Hermes, "Let me see <tool_ca…> no. <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"),
        (Format::Hermes, "Just text, ending with <tool_c"),
        (Format::Hermes, "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>"),
        (Format::Llama3, "  {\"name\": \"now\", \"parameters\": {}}"),
        (Format::Llama3, "Text {not json}"),
        (Format::Mistral(None), " [{\"name\": \"now\", \"arguments\": {}}]"),
        (Format::Mistral(None), "Not [a call]"),
        (Format::Mistral(None), "[not json"),
        (Format::Generic, r#"{"response": "caf\u00e9 \ud83d\ude00 \"q\" \\ done"}"#),
        (Format::Generic, r#"{"response": "cut \ud83d"#),
        (Format::Generic, r#"{"tool_calls": [{"name": "now", "arguments": {}}]}"#),
    ];
    for (format, text) in cases {
        let whole = read(format, text);
        for size in 1..=7 {
            let mut r = Reader::new(format);
            let mut sent = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                sent.push_str(&r.push(&piece.iter().collect::<String>()));
            }
            let end = r.finish();
            assert_eq!(end.calls, whole.calls, "{text} by {size}");
            sent.push_str(end.content.as_deref().unwrap_or_default());
            assert_eq!(
                sent,
                whole.content.clone().unwrap_or_default(),
                "{text} by {size}"
            );
        }
    }
    // Hermes content goes out before the call begins; generic answers as they are written.
    let mut r = Reader::new(Format::Hermes);
    assert_eq!(r.push("Checking <tool"), "Checking ");
    assert_eq!(r.push("_call>{"), "");
    let mut r = Reader::new(Format::Generic);
    assert_eq!(r.push("{\"response\": \"Hel"), "Hel");
    assert_eq!(r.push("lo\\"), "lo");
    assert_eq!(r.push("n\""), "\n");
}

/// A template that knows tools gets them and the tool turns as they are; one that does not
/// gets them described in a system turn, calls as the generic reply and results as tool
/// turns — or user turns where the template refuses other roles.
#[test]
fn prompts_tell_the_model_of_tools() {
    let mut tok = tiny_fixture();
    let mut call = Message::new("assistant", "");
    call.tool_calls = Some(vec![json!({"type": "function", "id": "c1",
        "function": {"name": "now", "arguments": {"tz": "UTC"}}})]);
    let mut result = Message::new("tool", "12:00");
    result.tool_call_id = Some("c1".into());
    let msgs = vec![Message::new("user", "Time?"), call, result];
    let t = tools(Format::Generic, json!("auto"), None);
    let text = |tok: &Tokenizer, f: Format, t: Option<&Tools>| {
        tok.decode(&encode(tok, msgs.clone(), t, f, Map::new(), ChatEnd::Generate).unwrap())
            .unwrap()
    };
    let generic = text(&tok, Format::Generic, Some(&t));
    assert!(generic.contains("You can call these tools"), "{generic}");
    assert!(generic.contains(r#"{"name": "get_weather", "parameters": {"#));
    assert!(generic.contains(r#"{"tool_calls": [{"name": "now", "arguments": {"tz": "UTC"}}]}"#));
    assert!(
        generic.contains(
            r#"tool
{"tool_call_id": "c1", "content": "12:00"}"#
        ),
        "{generic}"
    );
    // Without tools offered the history still reads; no description.
    assert!(!text(&tok, Format::Generic, None).contains("You can call"));
    // A template refusing other roles than user and assistant.
    tok.chat_template = Some(
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('roles') }}{% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}".into(),
    );
    let strict = text(&tok, Format::Generic, Some(&t));
    assert!(
        strict.starts_with("[user] You can call these tools"),
        "{strict}"
    );
    assert!(strict.contains("\n\nTime?"));
    assert!(
        strict.contains(r#"[user] {"tool_call_id": "c1""#),
        "{strict}"
    );
    // A Hermes template renders tools, calls and results itself.
    tok.chat_template = Some(concat!(
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>\n{% endif %}",
        "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>{% endfor %}",
        "{% elif m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>{% else %}{{ m.role }}: {{ m.content }}{% endif %}\n{% endfor %}"
    ).into());
    let h = tools(Format::Hermes, json!("auto"), None);
    assert_eq!(
        text(&tok, Format::Hermes, Some(&h)),
        "<tools>get_weather;now;</tools>\nuser: Time?\n<tool_call>now {\"tz\": \"UTC\"}</tool_call>\n<tool_response>12:00</tool_response>\n"
    );
}
