//! `paradraft bench --prompts FILE.jsonl`: the user's own prompts, one JSON object a line, in
//! any of the shapes speculative-decoding benchmarks and chat logs come in, grouped into one
//! prompt set per category:
//! - Spec-Bench / MT-Bench `question.jsonl`: `{"question_id", "category", "turns": [..]}`;
//! - OpenAI chat: `{"messages": [{"role", "content"}]}` (content a string or text parts);
//! - ShareGPT: `{"conversations": [{"from", "value"}]}`;
//! - plain: `{"prompt": ".."}`.
//!
//! User turns are run in order, each method answering them itself (as MT-Bench's second turn);
//! a leading system message is kept; assistant messages in the file are not used. The category
//! is the `--category-field` (default `category`; without one, a line's set is the file's name).

use super::datasets::{Item, PromptSet};
use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// Where the categories come from.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The field naming a line's category; `None`: `category` where a line has it, else the
    /// file's name. A field named here must be on every line.
    pub category_field: Option<String>,
    /// Most prompts per category (`None`: all).
    pub per_category: Option<usize>,
}

/// Reads `path` into prompt sets, one per category in order of first appearance. Any bad line
/// is an error naming the file and line; nothing is returned then.
pub fn load(path: &Path, o: &Options) -> Result<Vec<PromptSet>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prompts".into());
    let mut sets: Vec<PromptSet> = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| Error::BadRequest(format!("{}:{}: {why}", path.display(), i + 1));
        let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON ({e})")))?;
        if !v.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        let (system, turns) = turns_of(&v).map_err(bad)?;
        let category = category_of(&v, o.category_field.as_deref(), &stem).map_err(bad)?;
        let id = match v.get("question_id").or_else(|| v.get("id")) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => format!("line {}", i + 1),
        };
        let item = Item { id, system, turns };
        match sets.iter_mut().find(|s| s.name == category) {
            Some(s) => s.items.push(item),
            None => sets.push(PromptSet {
                name: category,
                items: vec![item],
            }),
        }
    }
    if sets.is_empty() {
        return Err(Error::BadRequest(format!("{}: no prompts", path.display())));
    }
    if let Some(n) = o.per_category {
        if n == 0 {
            return Err(Error::BadRequest("--num-prompts must be at least 1".into()));
        }
        for s in &mut sets {
            s.items.truncate(n);
        }
    }
    Ok(sets)
}

/// A line's system message and user turns.
fn turns_of(v: &Value) -> std::result::Result<(Option<String>, Vec<String>), String> {
    let text = |x: &Value, what: &str| -> std::result::Result<String, String> {
        let s = match x {
            Value::String(s) => s.clone(),
            // OpenAI content parts: the text ones, joined.
            Value::Array(parts) => parts
                .iter()
                .filter(|p| p["type"].as_str().is_none_or(|t| t == "text"))
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => return Err(format!("{what} is not text")),
        };
        match s.trim().is_empty() {
            true => Err(format!("{what} is empty")),
            false => Ok(s),
        }
    };
    let (mut system, mut turns) = (None, vec![]);
    if let Some(t) = v.get("turns") {
        let arr = t.as_array().ok_or("\"turns\" is not a list")?;
        for (k, x) in arr.iter().enumerate() {
            turns.push(text(x, &format!("turn {}", k + 1))?);
        }
    } else if let Some(m) = v.get("messages").or_else(|| v.get("conversations")) {
        let arr = m.as_array().ok_or("the messages are not a list")?;
        for (k, msg) in arr.iter().enumerate() {
            let role = msg["role"].as_str().or_else(|| msg["from"].as_str());
            let body = msg.get("content").or_else(|| msg.get("value"));
            let (Some(role), Some(body)) = (role, body) else {
                return Err(format!(
                    "message {} has no role/content (or from/value)",
                    k + 1
                ));
            };
            let what = format!("message {}", k + 1);
            match role {
                "user" | "human" => turns.push(text(body, &what)?),
                "system" if turns.is_empty() && system.is_none() => {
                    system = Some(text(body, &what)?)
                }
                "system" => return Err(format!("{what}: a system message after the first turn")),
                "assistant" | "gpt" | "model" => {}
                r => return Err(format!("{what} has role {r:?}")),
            }
        }
    } else if let Some(p) = v.get("prompt") {
        turns.push(text(p, "the prompt")?);
    } else {
        return Err(
            "no prompt: want \"turns\", \"messages\", \"conversations\" or \"prompt\"".into(),
        );
    }
    if turns.is_empty() {
        return Err("no user turn".into());
    }
    Ok((system, turns))
}

/// A line's category.
fn category_of(v: &Value, field: Option<&str>, stem: &str) -> std::result::Result<String, String> {
    let name = field.unwrap_or("category");
    let c = match v.get(name) {
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err(format!("the {name:?} field is not a string")),
        None if field.is_some() => return Err(format!("no {name:?} field")),
        None => return Ok(stem.to_string()),
    };
    match c.is_empty() {
        true => Err(format!("the {name:?} field is empty")),
        false => Ok(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(lines: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("question.jsonl");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        (d, p)
    }

    #[test]
    fn every_shape_loads_into_sets_per_category() {
        let (_d, p) = write(&[
            r#"{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]}"#,
            r#"{"question_id": 82, "category": "math", "turns": ["What is 2+2?"]}"#,
            r#"{"id": "c1", "category": "writing", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]}"#,
            "",
            r#"{"category": "math", "conversations": [{"from": "human", "value": "3*3?"}, {"from": "gpt", "value": "9"}]}"#,
            r#"{"category": "math", "prompt": "Integrate x."}"#,
        ]);
        let sets = load(&p, &Options::default()).unwrap();
        let names: Vec<&str> = sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["writing", "math"]);
        let w = &sets[0].items;
        assert_eq!((w[0].id.as_str(), w[0].turns.len()), ("81", 2));
        assert_eq!(w[1].system.as_deref(), Some("Be brief."));
        assert_eq!(w[1].turns, ["Hi", "Again"]);
        let m = &sets[1].items;
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].turns, ["3*3?"]);
        assert_eq!(m[2].id, "line 6");
        // Capped per category; without categories the file's name is the set.
        let o = Options {
            per_category: Some(1),
            ..Default::default()
        };
        assert!(load(&p, &o).unwrap().iter().all(|s| s.items.len() == 1));
        let (_d, p) = write(&[r#"{"prompt": "a"}"#, r#"{"prompt": "b"}"#]);
        let s = load(&p, &Options::default()).unwrap();
        assert_eq!((s[0].name.as_str(), s[0].items.len()), ("question", 2));
        // Another field names the category.
        let (_d, p) = write(&[r#"{"prompt": "a", "task": "qa"}"#]);
        let o = Options {
            category_field: Some("task".into()),
            ..Default::default()
        };
        assert_eq!(load(&p, &o).unwrap()[0].name, "qa");
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        let cases: [(&str, &str); 9] = [
            ("{not json", "not JSON"),
            ("[1, 2]", "not a JSON object"),
            (r#"{"text": "x"}"#, "no prompt"),
            (r#"{"prompt": "   "}"#, "the prompt is empty"),
            (r#"{"turns": "x"}"#, "not a list"),
            (
                r#"{"messages": [{"role": "assistant", "content": "x"}]}"#,
                "no user turn",
            ),
            (
                r#"{"messages": [{"role": "tool", "content": "x"}]}"#,
                "role \"tool\"",
            ),
            (r#"{"prompt": "x", "category": ""}"#, "field is empty"),
            (r#"{"prompt": "x", "category": [1]}"#, "not a string"),
        ];
        for (line, want) in cases {
            let (_d, p) = write(&[r#"{"prompt": "fine"}"#, line]);
            let e = load(&p, &Options::default()).unwrap_err().to_string();
            assert!(
                e.contains("question.jsonl:2: ") && e.contains(want),
                "{line}: {e}"
            );
        }
        let (_d, p) = write(&[r#"{"prompt": "x"}"#]);
        let o = Options {
            category_field: Some("task".into()),
            ..Default::default()
        };
        let e = load(&p, &o).unwrap_err().to_string();
        assert!(e.contains(":1: no \"task\" field"), "{e}");
        let (_d, p) = write(&[""]);
        let e = load(&p, &Options::default()).unwrap_err().to_string();
        assert!(e.contains("no prompts"), "{e}");
        let e = load(Path::new("/no/such/file.jsonl"), &Options::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("/no/such/file.jsonl"), "{e}");
    }
}
