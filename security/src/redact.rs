//! Secrets in unit environments are never shown (issue 8).
//!
//! A unit's environment may carry credentials (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`).
//! pdwarden needs the values to start the process, but nothing it logs or
//! shows — `status`, `history`, operation reports, event details — may repeat
//! them. Redaction is by variable name: a case-insensitive glob (`*` only)
//! from a configurable list, [`DEFAULT_PATTERNS`] unless configured.
//!
//! It is applied where text leaves the process for people (the CLI's replies,
//! logs), not where values are needed (spawning, the change gate's comparison
//! of a process's live environment with the one it asked for). It recognises
//! the three shapes an environment takes in pdwarden's output: a map under a
//! key ending in `env` (`{"env": {"HF_TOKEN": "…"}}`), a list of
//! `{"key": K, "value": V}` under such a key, and `NAME=VALUE` inside free
//! text (a change's description, a log tail), for upper-case names.

use serde_json::Value;

/// What replaces a secret value.
pub const REDACTED: &str = "[redacted]";

/// Variable names treated as secret unless configured otherwise.
pub const DEFAULT_PATTERNS: &[&str] = &["*TOKEN*", "*SECRET*", "*KEY*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*"];

/// The default list, owned (for config defaults).
pub fn default_patterns() -> Vec<String> {
    DEFAULT_PATTERNS.iter().map(|s| s.to_string()).collect()
}

/// Redacts by variable-name pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redactor {
    /// Upper-cased globs.
    patterns: Vec<String>,
}

impl Default for Redactor {
    fn default() -> Self {
        Self::new(DEFAULT_PATTERNS)
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob(rest, &name[i..])),
        Some((c, rest)) => name.first() == Some(c) && glob(rest, &name[1..]),
    }
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

impl Redactor {
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Self {
        Self {
            patterns: patterns.iter().map(|p| p.as_ref().to_ascii_uppercase()).collect(),
        }
    }

    /// Whether a variable of this name holds a secret.
    pub fn is_secret(&self, name: &str) -> bool {
        let name = name.to_ascii_uppercase();
        self.patterns.iter().any(|p| glob(p.as_bytes(), name.as_bytes()))
    }

    /// The value to show for variable `name`.
    pub fn value<'a>(&self, name: &str, value: &'a str) -> &'a str {
        if self.is_secret(name) { REDACTED } else { value }
    }

    /// Free text with every `NAME=VALUE` of a secret upper-case NAME
    /// replaced by `NAME=[redacted]` (the value runs to the next whitespace,
    /// comma, semicolon or quote).
    pub fn text(&self, s: &str) -> String {
        if !s.contains('=') {
            return s.to_string();
        }
        let stop = |c: char| c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\'' | ')' | ']' | '}');
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(eq) = rest.find('=') {
            let (before, after) = rest.split_at(eq);
            let name_start = before
                .char_indices()
                .rev()
                .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |(i, c)| i + c.len_utf8());
            let name = &before[name_start..];
            out.push_str(before);
            out.push('=');
            let after = &after[1..];
            if is_env_name(name) && self.is_secret(name) {
                let end = after.find(stop).unwrap_or(after.len());
                if end > 0 {
                    out.push_str(REDACTED);
                }
                rest = &after[end..];
            } else {
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    /// Redacts a JSON document in place (see the module doc for the shapes).
    pub fn json(&self, v: &mut Value) {
        match v {
            Value::String(s) if s.contains('=') => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|i| self.json(i)),
            Value::Object(map) => {
                for (k, val) in map.iter_mut() {
                    if k.to_ascii_lowercase().ends_with("env") {
                        self.env_value(val);
                    }
                    self.json(val);
                }
            }
            _ => {}
        }
    }

    /// Serialises `value` as compact JSON, redacted exactly as
    /// [`Redactor::json`] would, without building a `serde_json::Value`:
    /// a fleet-wide `status` is megabytes, and the intermediate tree and
    /// the walk over it cost more than the serialisation itself. Every
    /// string value has its `NAME=VALUE` secrets replaced on the way out;
    /// should the document contain a key ending in `env` (an environment,
    /// whose shape matters), it falls back to the `Value` walk.
    pub fn to_json_string<T: serde::Serialize + ?Sized>(&self, value: &T) -> serde_json::Result<String> {
        let mut out = Vec::with_capacity(4096);
        let env_key_seen = std::cell::Cell::new(false);
        let formatter = RedactingFormatter {
            redactor: self,
            string: String::new(),
            in_string: false,
            in_key: false,
            env_key_seen: &env_key_seen,
        };
        value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))?;
        if env_key_seen.get() {
            let mut v = serde_json::to_value(value)?;
            self.json(&mut v);
            return serde_json::to_string(&v);
        }
        // The formatter writes only whole strings escaped by `escape_into`
        // and serde_json's own ASCII punctuation and numbers.
        Ok(String::from_utf8(out).expect("serde_json and escape_into write UTF-8"))
    }

    /// An environment as a map or as a list of `{key|name, value}`.
    fn env_value(&self, v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (name, val) in map.iter_mut() {
                    if self.is_secret(name) && !val.is_null() {
                        *val = Value::String(REDACTED.into());
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    let Value::Object(entry) = item else { continue };
                    let name = entry.get("key").or_else(|| entry.get("name")).and_then(Value::as_str);
                    if name.is_some_and(|n| self.is_secret(n))
                        && let Some(val) = entry.get_mut("value")
                        && !val.is_null()
                    {
                        *val = Value::String(REDACTED.into());
                    }
                }
            }
            _ => {}
        }
    }
}

/// Buffers each string until it ends, so redaction sees it whole (serde_json
/// hands strings over in fragments split at escapes).
struct RedactingFormatter<'a> {
    redactor: &'a Redactor,
    /// The string being written, unescaped (reused from string to string).
    string: String,
    in_string: bool,
    in_key: bool,
    env_key_seen: &'a std::cell::Cell<bool>,
}

/// JSON string escaping, as serde_json does it (quotes, backslash, control
/// characters; everything else verbatim).
fn escape_into<W: ?Sized + std::io::Write>(w: &mut W, s: &str) -> std::io::Result<()> {
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc: Option<&[u8]> = match c {
            '"' => Some(b"\\\""),
            '\\' => Some(b"\\\\"),
            '\n' => Some(b"\\n"),
            '\r' => Some(b"\\r"),
            '\t' => Some(b"\\t"),
            '\u{08}' => Some(b"\\b"),
            '\u{0c}' => Some(b"\\f"),
            c if (c as u32) < 0x20 => None,
            _ => continue,
        };
        w.write_all(&s.as_bytes()[start..i])?;
        match esc {
            Some(e) => w.write_all(e)?,
            None => write!(w, "\\u{:04x}", c as u32)?,
        }
        start = i + c.len_utf8();
    }
    w.write_all(&s.as_bytes()[start..])
}

impl serde_json::ser::Formatter for RedactingFormatter<'_> {
    fn begin_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.string.clear();
        self.in_string = true;
        w.write_all(b"\"")
    }

    fn end_string<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.in_string = false;
        let s = self.string.as_str();
        if self.in_key {
            if s.len() >= 3 && s.as_bytes()[s.len() - 3..].eq_ignore_ascii_case(b"env") {
                self.env_key_seen.set(true);
            }
            escape_into(w, s)?;
        } else if s.contains('=') {
            escape_into(w, &self.redactor.text(s))?;
        } else {
            escape_into(w, s)?;
        }
        w.write_all(b"\"")
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(&mut self, w: &mut W, fragment: &str) -> std::io::Result<()> {
        if self.in_string {
            self.string.push_str(fragment);
            Ok(())
        } else {
            w.write_all(fragment.as_bytes())
        }
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CharEscape;
        let c = match escape {
            CharEscape::Quote => '"',
            CharEscape::ReverseSolidus => '\\',
            CharEscape::Solidus => '/',
            CharEscape::Backspace => '\u{08}',
            CharEscape::FormFeed => '\u{0c}',
            CharEscape::LineFeed => '\n',
            CharEscape::CarriageReturn => '\r',
            CharEscape::Tab => '\t',
            CharEscape::AsciiControl(b) => char::from(b),
        };
        if self.in_string {
            self.string.push(c);
            Ok(())
        } else {
            escape_into(w, c.encode_utf8(&mut [0; 4]))
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.in_key = true;
        if first { Ok(()) } else { w.write_all(b",") }
    }

    fn end_object_key<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.in_key = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The streaming serialiser redacts exactly as the `Value` walk does:
    /// secrets in free text (also where serde_json splits the string at an
    /// escape), keys untouched, and environments (via the fallback).
    #[test]
    fn streaming_serialiser_matches_the_value_walk() {
        let r = Redactor::default();
        let docs = [
            json!({"detail": "started with HF_TOKEN=hf_abc\\def\"x and PATH=/bin", "n": 3, "ok": true}),
            json!({"list": ["A_KEY=v1\tB=2", "plain \u{1} text", null, 1.5], "KEY=x": "y"}),
            json!({"unit": {"env": {"HF_TOKEN": "hf_abc", "CUDA_VISIBLE_DEVICES": "0"}}}),
            json!({"set_env": [{"key": "DB_PASSWORD", "value": "p"}, {"name": "X", "value": "1"}]}),
            json!({"quote": "é \u{7f} \\ / \"", "empty": ""}),
        ];
        for doc in docs {
            let mut expected = doc.clone();
            r.json(&mut expected);
            let streamed = r.to_json_string(&doc).unwrap();
            let parsed: Value = serde_json::from_str(&streamed).unwrap_or_else(|e| panic!("{e}: {streamed}"));
            assert_eq!(parsed, expected, "{streamed}");
            assert!(
                !streamed.contains("hf_abc") && !streamed.contains("\"p\""),
                "{streamed}"
            );
        }
    }

    /// The default patterns catch the usual credential names, case-insensitively,
    /// and leave ordinary variables alone.
    #[test]
    fn default_patterns() {
        let r = Redactor::default();
        for secret in ["HF_TOKEN", "aws_secret_access_key", "OPENAI_API_KEY", "DB_PASSWORD"] {
            assert!(r.is_secret(secret), "{secret}");
        }
        for plain in ["CUDA_VISIBLE_DEVICES", "PATH", "SGLANG_KNOB"] {
            assert!(!r.is_secret(plain), "{plain}");
        }
        assert!(Redactor::new(&["MY_*"]).is_secret("my_var"));
        assert!(!Redactor::new(&["MY_*"]).is_secret("HF_TOKEN"));
    }

    /// `NAME=VALUE` in free text: secret values go, the rest stays.
    #[test]
    fn text() {
        let r = Redactor::default();
        assert_eq!(
            r.text("set HF_TOKEN=hf_abc, KNOB=512 and 'API_KEY=x y'"),
            "set HF_TOKEN=[redacted], KNOB=512 and 'API_KEY=[redacted] y'"
        );
        assert_eq!(r.text("max_tokens=8 a==b"), "max_tokens=8 a==b");
        assert_eq!(r.text("ünï HF_TOKEN=é"), "ünï HF_TOKEN=[redacted]");
    }

    /// Maps and key/value lists under an `env` key, and strings anywhere,
    /// are redacted; a probe's `tokens` count is not an environment.
    #[test]
    fn json_shapes() {
        let r = Redactor::default();
        let mut v = json!({
            "tokens": 8,
            "versions": [{"env": {"HF_TOKEN": "hf_abc", "KNOB": "1"}}],
            "set_env": {"DB_PASSWORD": "pw"},
            "processes": [{"env": [{"key": "API_KEY", "present": true, "value": "k"}, {"key": "KNOB", "value": "2"}]}],
            "live": {"env": {"API_KEY": null}},
            "reasons": ["changed HF_TOKEN=hf_abc"],
        });
        r.json(&mut v);
        assert_eq!(v["tokens"], 8);
        assert_eq!(v["versions"][0]["env"]["HF_TOKEN"], REDACTED);
        assert_eq!(v["versions"][0]["env"]["KNOB"], "1");
        assert_eq!(v["set_env"]["DB_PASSWORD"], REDACTED);
        assert_eq!(v["processes"][0]["env"][0]["value"], REDACTED);
        assert_eq!(v["processes"][0]["env"][1]["value"], "2");
        assert_eq!(v["live"]["env"]["API_KEY"], Value::Null);
        assert_eq!(v["reasons"][0], "changed HF_TOKEN=[redacted]");
    }
}
