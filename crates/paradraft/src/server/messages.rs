//! A chat request's messages as the chat template reads them: text or text parts, a
//! participant's `name` (accepted, unused), an assistant's `tool_calls` and a tool's answer
//! (`role: "tool"` with its `tool_call_id`).

use super::error::ApiError;
use crate::model::Message;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// Accepted (OpenAI allows a participant name) and not used by the template.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// A message's content: text, or text parts.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

impl ChatMessage {
    /// Message `i` for the template.
    pub fn to_message(&self, i: usize) -> Result<Message, ApiError> {
        let bad = |m: String| ApiError::invalid(m, Some("messages"));
        let role = match self.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            r => {
                return Err(bad(format!(
                    "messages[{i}].role {r:?} is not supported (system, developer, user, assistant, tool)"
                )))
            }
        };
        if let Some(k) = self.other.keys().next() {
            let supported = ["refusal"];
            if !supported.contains(&k.as_str()) || !self.other[k].is_null() {
                return Err(bad(format!("messages[{i}].{k} is not supported")));
            }
        }
        let calls = match &self.tool_calls {
            Some(c) if role != "assistant" && !c.is_empty() => {
                return Err(bad(format!(
                    "messages[{i}].tool_calls: only assistant messages make tool calls"
                )))
            }
            Some(c) => c
                .iter()
                .enumerate()
                .map(|(j, c)| template_call(c).ok_or_else(|| bad(format!(
                    "messages[{i}].tool_calls[{j}] must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"
                ))))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![],
        };
        let text = match &self.content {
            None if !calls.is_empty() => String::new(),
            None => return Err(bad(format!("messages[{i}].content is required"))),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(s)) => t.push_str(s),
                        _ => {
                            return Err(bad(format!(
                                "messages[{i}].content[{j}]: only text parts are supported"
                            )))
                        }
                    }
                }
                t
            }
        };
        let mut m = Message::new(role, &text);
        if role == "tool" {
            match &self.tool_call_id {
                Some(id) => m.tool_call_id = Some(id.clone()),
                None => return Err(bad(format!("messages[{i}].tool_call_id is required"))),
            }
        }
        if !calls.is_empty() {
            m.tool_calls = Some(calls);
        }
        Ok(m)
    }
}

/// An OpenAI tool call (`arguments` a JSON string) in the templates' shape (`arguments` an
/// object; a string that is not JSON stays a string).
fn template_call(c: &Value) -> Option<Value> {
    let f = c.get("function")?;
    let name = f.get("name")?.as_str()?;
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!(s)),
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => json!({}),
        Some(_) => return None,
    };
    let mut out = json!({"type": "function", "function": {"name": name, "arguments": args}});
    if let Some(id) = c.get("id") {
        out["id"] = id.clone();
    }
    Some(out)
}
