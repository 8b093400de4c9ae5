//! JSON as Python's `json.dumps` writes it (`, ` and `: `, or `indent` spaces with `,` ending
//! lines; non-ASCII kept): what Hugging Face's chat templates get from `tojson`, so that a
//! template rendering tools or tool calls gives the text the model was trained on.

use serde_json::Value;
use std::io::Write;

/// Python's layout: its item and key separators, an optional indent, ASCII-only strings.
struct Py<'a> {
    item: &'a [u8],
    key: &'a [u8],
    indent: Option<&'a [u8]>,
    ascii: bool,
    depth: usize,
    /// Whether the container being written has a value yet.
    has_value: bool,
}

impl Py<'_> {
    fn line(&self, w: &mut (impl ?Sized + Write)) -> std::io::Result<()> {
        if let Some(pad) = self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(pad)?;
            }
        }
        Ok(())
    }

    fn open(&mut self, w: &mut (impl ?Sized + Write), c: &[u8]) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(c)
    }

    fn close(&mut self, w: &mut (impl ?Sized + Write), c: &[u8]) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.line(w)?;
        }
        w.write_all(c)
    }

    fn item(&mut self, w: &mut (impl ?Sized + Write), first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(self.item)?;
        }
        self.line(w)
    }
}

impl serde_json::ser::Formatter for Py<'_> {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(self.key)
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    /// With `ensure_ascii`, characters past ASCII as `\uXXXX` (surrogate pairs past the BMP).
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ascii {
            return w.write_all(fragment.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// How [`dumps_with`] lays JSON out: `json.dumps`'s arguments.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub indent: Option<usize>,
    /// (item, key) separators; Python's defaults when `None`.
    pub separators: Option<(String, String)>,
    pub ensure_ascii: bool,
}

/// `json.dumps(v, ensure_ascii=False, indent=indent)`.
pub fn dumps(v: &Value, indent: Option<usize>) -> String {
    dumps_with(
        v,
        &Layout {
            indent,
            ..Layout::default()
        },
    )
}

/// `json.dumps(v, indent=…, separators=…, ensure_ascii=…)`.
pub fn dumps_with(v: &Value, l: &Layout) -> String {
    let pad = l.indent.map(|n| vec![b' '; n]);
    let (item, key) = match &l.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        // With an indent, Python ends lines with a bare `,`.
        None if l.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let f = Py {
        item: item.as_bytes(),
        key: key.as_bytes(),
        indent: pad.as_deref(),
        ascii: l.ensure_ascii,
        depth: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    match serde::Serialize::serialize(v, &mut serde_json::Serializer::with_formatter(&mut out, f)) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The templates' `tojson` filter (`indent`, `separators`, `ensure_ascii` and `sort_keys`, as
/// `json.dumps` takes them; `ensure_ascii` false by default, as transformers' filter has it).
pub fn tojson(
    v: &minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    let ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let seps: Option<minijinja::Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let bad =
        |m: &str| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, m.to_string());
    let separators = match seps {
        None => None,
        Some(s) if s.is_none() || s.is_undefined() => None,
        Some(s) => {
            let parts: Vec<String> = s
                .try_iter()
                .map_err(|_| bad("tojson: separators must be (item, key)"))?
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("tojson: separators must be two strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([i, k]) => Some((i, k)),
                Err(_) => return Err(bad("tojson: separators must be two strings")),
            }
        }
    };
    let mut json = serde_json::to_value(v).map_err(|e| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string())
    })?;
    if sort == Some(true) {
        json = sorted(json);
    }
    let layout = Layout {
        indent,
        separators,
        ensure_ascii: ascii.unwrap_or(false),
    };
    Ok(minijinja::Value::from_safe_string(dumps_with(
        &json, &layout,
    )))
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
        // Python 3.11's json.dumps of the same value with each argument.
        let v: Value =
            serde_json::from_str(r#"{"b": [1, 2.5, "é\n😀"], "a": {}, "c": [], "d": {"x": [[]]}}"#)
                .unwrap();
        let out = env
            .render_str(
                "{{ x | tojson(ensure_ascii=true) }}|{{ x | tojson(separators=(',', ':')) }}|\
                 {{ x | tojson(indent=2, separators=(',', ':')) }}|{{ x | tojson(indent=1) }}",
                minijinja::context! { x => v },
            )
            .unwrap();
        let want = [
            r#"{"b": [1, 2.5, "\u00e9\n\ud83d\ude00"], "a": {}, "c": [], "d": {"x": [[]]}}"#,
            r#"{"b":[1,2.5,"é\n😀"],"a":{},"c":[],"d":{"x":[[]]}}"#,
            "{\n  \"b\":[\n    1,\n    2.5,\n    \"é\\n😀\"\n  ],\n  \"a\":{},\n  \"c\":[],\n  \"d\":{\n    \"x\":[\n      []\n    ]\n  }\n}",
            "{\n \"b\": [\n  1,\n  2.5,\n  \"é\\n😀\"\n ],\n \"a\": {},\n \"c\": [],\n \"d\": {\n  \"x\": [\n   []\n  ]\n }\n}",
        ];
        assert_eq!(out, want.join("|"));
        assert!(env
            .render_str("{{ 1 | tojson(separators=3) }}", minijinja::context! {})
            .is_err());
    }
}
