//! JSON as Python's `json.dumps` writes it (`, ` and `: `, or `indent` spaces with `,` ending
//! lines; non-ASCII kept): what Hugging Face's chat templates get from `tojson`, so that a
//! template rendering tools or tool calls gives the text the model was trained on.

use serde_json::Value;
use std::io::Write;

struct Spaced;

/// `, ` before every item of an array or an object but the first.
fn separate<W: ?Sized + Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separate(w, first)
    }

    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separate(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `json.dumps(v, ensure_ascii=False, indent=indent)`.
pub fn dumps(v: &Value, indent: Option<usize>) -> String {
    let mut out = Vec::new();
    let written = match indent {
        None => serde::Serialize::serialize(
            v,
            &mut serde_json::Serializer::with_formatter(&mut out, Spaced),
        ),
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(v, &mut serde_json::Serializer::with_formatter(&mut out, f))
        }
    };
    match written {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The templates' `tojson` filter (`indent` honoured; `sort_keys` too).
pub fn tojson(
    v: &minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<minijinja::Value> = kwargs.get("ensure_ascii")?;
    let _: Option<minijinja::Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut json = serde_json::to_value(v).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    if sort == Some(true) {
        json = sorted(json);
    }
    Ok(minijinja::Value::from_safe_string(dumps(&json, indent)))
}

fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut e: Vec<(String, Value)> = m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            e.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(e.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's own output for the same values.
    #[test]
    fn writes_what_python_writes() {
        let v: Value = serde_json::from_str(r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": []}"#).unwrap();
        assert_eq!(
            dumps(&v, None),
            r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": []}"#
        );
        assert_eq!(
            dumps(&v, Some(2)),
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\"\n  ],\n  \"a\": {},\n  \"c\": []\n}"
        );
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let out = env
            .render_str(
                "{{ x | tojson }}|{{ x | tojson(sort_keys=true) }}|{{ '<a>' | tojson }}",
                minijinja::context! { x => v },
            )
            .unwrap();
        assert_eq!(
            out,
            r#"{"b": [1, 2.5, "é\n"], "a": {}, "c": []}|{"a": {}, "b": [1, 2.5, "é\n"], "c": []}|"<a>""#
        );
    }
}
