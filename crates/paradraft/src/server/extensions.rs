//! Request fields that other servers take and the OpenAI API does not: llama-server's (the
//! ones its web UI and clients send) and vLLM's. Each is served where it means something this
//! server does (`n_predict`, vLLM's `guided_json` / `guided_regex` / `guided_choice`),
//! accepted at the values that ask for nothing (a sampler switched off, a transport or cache
//! hint), and otherwise refused with a 400 naming it — never silently ignored. A field no
//! server knows is a 400 naming it too.

use super::error::ApiError;
use crate::grammar::Grammar;
use crate::model::ChatEnd;
use serde_json::{Map, Value};

/// What the extension fields ask for that this server serves.
#[derive(Clone, Debug, Default)]
pub struct Served {
    /// `n_predict`: most tokens to generate (`Some(None)`: up to the context, llama's −1).
    pub n_predict: Option<Option<i64>>,
    /// Grammars from vLLM's `guided_*` fields, with the field that asked.
    pub grammars: Vec<(Grammar, &'static str)>,
    /// vLLM's `add_generation_prompt: false` (the conversation closed) or
    /// `continue_final_message: true` (its last turn continued); `None`: the generation prompt.
    pub end: Option<ChatEnd>,
}

/// Whether `v` is absent-like or equal to one of `values` (numbers compared as numbers).
fn is_num(v: &Value, values: &[f64]) -> bool {
    v.is_null() || v.as_f64().is_some_and(|x| values.contains(&x))
}

fn is_bool(v: &Value, b: bool) -> bool {
    v.is_null() || v.as_bool() == Some(b)
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Whether llama-server's or vLLM's field `k` set to `v` asks for nothing this server does
/// differently (`None`: no server of those has the field).
fn neutral(k: &str, v: &Value) -> Option<bool> {
    Some(match k {
        // The prefix cache always runs and is exact; slots, context shifting and keep-alive
        // pings do not change an output.
        "cache_prompt" | "backend_sampling" => v.is_boolean() || v.is_null(),
        "id_slot" | "n_keep" | "n_discard" | "n_cache_reuse" | "sse_ping_interval" => {
            v.is_null() || v.is_i64() || v.is_u64()
        }
        // Parameters of samplers that are off unless their switch below is on.
        "xtc_threshold"
        | "dynatemp_exponent"
        | "repeat_last_n"
        | "dry_base"
        | "dry_allowed_length"
        | "dry_penalty_last_n"
        | "dry_sequence_breakers"
        | "mirostat_tau"
        | "mirostat_eta" => true,
        // Switches at their off values.
        "typical_p" | "length_penalty" => is_num(v, &[1.0]),
        "repeat_penalty" => is_num(v, &[1.0]),
        "xtc_probability" | "dynatemp_range" | "dry_multiplier" | "mirostat" | "min_keep"
        | "n_indent" | "min_tokens" | "priority" => is_num(v, &[0.0]),
        "top_n_sigma" | "t_max_prompt_ms" | "t_max_predict_ms" | "reasoning_budget_tokens" => {
            v.as_f64().is_none_or(|x| x <= 0.0)
        }
        "n_cmpl" => is_num(v, &[1.0]),
        "timings_per_token"
        | "return_tokens"
        | "return_progress"
        | "verbose"
        | "post_sampling_probs"
        | "ignore_eos"
        | "grammar_lazy"
        | "use_beam_search"
        | "include_stop_str_in_output"
        | "return_tokens_as_token_ids"
        | "add_special_tokens" => is_bool(v, false),
        "parse_tool_calls" | "skip_special_tokens" | "spaces_between_special_tokens" => {
            is_bool(v, true)
        }
        "response_fields" | "lora" | "stop_token_ids" | "bad_words" | "preserved_tokens"
        | "grammar_triggers" | "documents" => is_empty(v),
        "reasoning_format" => v.is_null() || v.as_str() == Some("none"),
        "truncate_prompt_tokens"
        | "prompt_logprobs"
        | "samplers"
        | "guided_grammar"
        | "structured_outputs"
        | "chat_format"
        | "chat_parser"
        | "generation_prompt"
        | "reasoning_control"
        | "adaptive_target"
        | "adaptive_decay"
        | "n_probs"
        | "mm_processor_kwargs"
        | "logits_processors" => v.is_null(),
        // Bookkeeping.
        "request_id" | "prompt_cache_key" | "safety_identifier" => true,
        _ => return None,
    })
}

/// Escapes `s` for a regular expression.
fn literal(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Checks the fields no OpenAI struct field took; returns what they ask to be served.
pub fn check(extra: &Map<String, Value>) -> Result<Served, ApiError> {
    let mut out = Served::default();
    let (mut generation_prompt, mut continue_last) = (None, None);
    for (k, v) in extra {
        let bad = |m: String| ApiError::invalid(m, None).param_named(k.clone());
        match k.as_str() {
            "n_predict" => match v.as_i64() {
                Some(-1) => out.n_predict = Some(None),
                Some(n) if n >= 1 => out.n_predict = Some(Some(n)),
                _ => return Err(bad(format!("n_predict must be -1 or at least 1, got {v}"))),
            },
            "guided_json" => match v {
                Value::Object(_) => out
                    .grammars
                    .push((Grammar::JsonSchema(v.clone()), "guided_json")),
                Value::String(s) => match serde_json::from_str::<Value>(s) {
                    Ok(s @ Value::Object(_)) => {
                        out.grammars.push((Grammar::JsonSchema(s), "guided_json"))
                    }
                    _ => return Err(bad("guided_json must be a JSON schema".into())),
                },
                _ => return Err(bad("guided_json must be a JSON schema".into())),
            },
            "guided_regex" => match v.as_str() {
                Some(r) => out
                    .grammars
                    .push((Grammar::Regex(r.to_string()), "guided_regex")),
                None => return Err(bad("guided_regex must be a string".into())),
            },
            "guided_choice" => match v.as_array().filter(|a| !a.is_empty()) {
                Some(a) if a.iter().all(Value::is_string) => {
                    let alts: Vec<String> = a
                        .iter()
                        .map(|c| literal(c.as_str().unwrap_or_default()))
                        .collect();
                    let r = format!("({})", alts.join("|"));
                    out.grammars.push((Grammar::Regex(r), "guided_choice"));
                }
                _ => {
                    return Err(bad(
                        "guided_choice must be a non-empty array of strings".into()
                    ))
                }
            },
            "add_generation_prompt" | "continue_final_message" => match v.as_bool() {
                Some(b) if k == "add_generation_prompt" => generation_prompt = Some(b),
                Some(b) => continue_last = Some(b),
                None => return Err(bad(format!("{k} must be a boolean, got {v}"))),
            },
            _ => match neutral(k, v) {
                Some(true) => {}
                Some(false) => {
                    return Err(bad(format!(
                        "{k} = {v} is not supported by this server (only values that leave it off)"
                    ))
                    .with_code("unsupported_parameter"))
                }
                None => return Err(bad(format!("unknown field `{k}`"))),
            },
        }
    }
    out.end = match (generation_prompt, continue_last) {
        (Some(true), Some(true)) => {
            return Err(ApiError::invalid(
                "continue_final_message needs add_generation_prompt: false",
                Some("continue_final_message"),
            ))
        }
        (_, Some(true)) => Some(ChatEnd::Continue),
        (Some(false), _) => Some(ChatEnd::Closed),
        _ => None,
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value) -> Option<String> {
        check(body.as_object().unwrap())
            .err()
            .and_then(|e| e.param.map(String::from))
    }

    /// What llama.cpp's web UI sends by default is accepted; anything asking for a sampler or
    /// a behaviour this server lacks is refused, naming it; unknown fields too.
    #[test]
    fn extension_fields_are_served_accepted_or_refused_by_name() {
        let webui = json!({
            "cache_prompt": true, "dynatemp_range": 0, "dynatemp_exponent": 1,
            "typical_p": 1, "xtc_probability": 0, "xtc_threshold": 0.1, "repeat_last_n": 64,
            "repeat_penalty": 1, "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2,
            "dry_penalty_last_n": -1, "timings_per_token": false, "backend_sampling": false,
            "reasoning_format": "none", "id_slot": -1, "n_keep": 0,
        });
        assert_eq!(param(webui), None);
        for (k, v) in [
            ("mirostat", json!(2)),
            ("typical_p", json!(0.9)),
            ("ignore_eos", json!(true)),
            ("samplers", json!(["top_k", "temperature"])),
            ("repeat_penalty", json!(1.1)),
            ("n_predict", json!(0)),
            ("guided_choice", json!([])),
            ("bogus", json!(1)),
        ] {
            assert_eq!(param(json!({k: v})).as_deref(), Some(k), "{k}");
        }
        let s = check(
            json!({"n_predict": -1, "guided_choice": ["a.b", "c"]})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(s.n_predict, Some(None));
        assert_eq!(s.end, None);
        let end = |b: Value| check(b.as_object().unwrap()).map(|s| s.end);
        assert_eq!(
            end(json!({"add_generation_prompt": false})).unwrap(),
            Some(ChatEnd::Closed)
        );
        assert_eq!(
            end(json!({"add_generation_prompt": false, "continue_final_message": true})).unwrap(),
            Some(ChatEnd::Continue)
        );
        assert!(
            end(json!({"add_generation_prompt": true, "continue_final_message": true})).is_err()
        );
        assert!(end(json!({"continue_final_message": "yes"})).is_err());
        assert_eq!(
            s.grammars,
            vec![(Grammar::Regex("(a\\.b|c)".into()), "guided_choice")]
        );
    }
}
