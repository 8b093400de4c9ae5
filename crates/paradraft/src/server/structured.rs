//! Structured output's request fields: `response_format` and llama-server's `json_schema`,
//! `grammar` (Lark) and `regex`, each compiled against the model's vocabulary before the
//! request is queued.

use super::error::ApiError;
use crate::grammar::Grammar;
use crate::model::Tokenizer;
use serde_json::Value;

/// The structured-output extensions both endpoints take besides `response_format`
/// (llama-server's names).
#[derive(Clone, Debug, Default)]
pub struct ConstrainFields {
    /// A Lark grammar (llguidance's dialect).
    pub grammar: Option<String>,
    /// A JSON schema the output must satisfy.
    pub json_schema: Option<Value>,
    /// A regular expression the whole output must match.
    pub regex: Option<String>,
    /// Grammars other fields asked for (vLLM's `guided_*`), with their field.
    pub more: Vec<(Grammar, &'static str)>,
}

impl ConstrainFields {
    /// The one grammar `response_format` and these fields ask for, compiled once against the
    /// model's vocabulary so that one that does not compile is refused here, naming its field.
    pub fn grammar(
        &self,
        response_format: &Option<Value>,
        tok: &Tokenizer,
        vocab: usize,
    ) -> Result<Option<Grammar>, ApiError> {
        let mut asked: Vec<(Grammar, &'static str)> = vec![];
        if let Some(rf) = response_format.as_ref().filter(|v| !v.is_null()) {
            let bad = |m: &str| ApiError::invalid(m, Some("response_format"));
            match rf.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => asked.push((Grammar::JsonObject, "response_format")),
                Some("json_schema") => {
                    let schema = rf
                        .get("json_schema")
                        .and_then(|j| j.get("schema"))
                        .filter(|s| s.is_object())
                        .ok_or_else(|| {
                            bad("response_format.json_schema.schema must be an object")
                        })?;
                    asked.push((Grammar::JsonSchema(schema.clone()), "response_format"));
                }
                _ => {
                    return Err(bad(
                        "response_format.type must be text, json_object or json_schema",
                    ))
                }
            }
        }
        if let Some(g) = &self.grammar {
            asked.push((Grammar::Lark(g.clone()), "grammar"));
        }
        if let Some(s) = &self.json_schema {
            if !s.is_object() {
                return Err(ApiError::invalid(
                    "json_schema must be an object",
                    Some("json_schema"),
                ));
            }
            asked.push((Grammar::JsonSchema(s.clone()), "json_schema"));
        }
        if let Some(r) = &self.regex {
            asked.push((Grammar::Regex(r.clone()), "regex"));
        }
        asked.extend(self.more.iter().cloned());
        let Some((g, field)) = asked.pop() else {
            return Ok(None);
        };
        if let Some((_, other)) = asked.first() {
            return Err(ApiError::invalid(
                format!("{other} and {field} both constrain the output: give one"),
                Some(field),
            ));
        }
        compile(&g, tok, vocab, field)?;
        Ok(Some(g))
    }
}

/// Compiles `g` against the model's vocabulary, so that one that does not compile is refused
/// before the queue, naming `field`.
pub fn compile(
    g: &Grammar,
    tok: &Tokenizer,
    vocab: usize,
    field: &'static str,
) -> Result<(), ApiError> {
    let compiled =
        crate::grammar::GrammarEnv::of(tok, vocab).and_then(|env| env.constraint(g).map(|_| ()));
    compiled.map_err(|e| ApiError::invalid(e.to_string(), Some(field)))
}
