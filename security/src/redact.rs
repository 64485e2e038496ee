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

/// A known secret value this long (in characters) is hidden wherever it
/// appears in a process's text ([`Redactor::text_with_env`]); a shorter one
/// only where its name introduces it, as it would erase ordinary words.
pub const MIN_BARE_VALUE: usize = 6;

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

    /// Whether a command-line flag (`--hf-token`, `api-key`) carries a
    /// secret: its name upper-cased with `-` as `_`, by the same patterns —
    /// except a count of tokens (`--max-num-batched-tokens`), which is a
    /// setting the gate must show, not a credential.
    pub fn is_secret_flag(&self, flag: &str) -> bool {
        let name = flag.trim_start_matches('-').replace('-', "_").to_ascii_uppercase();
        !name.ends_with("TOKENS") && self.is_secret(&name)
    }

    /// Free text with the value of every secret it names replaced by
    /// `[redacted]`, in each form pdwarden's reports and logs contain
    /// (issue 16, finding 9): `NAME=VALUE`, `NAME="VALUE"`, `NAME='VALUE'`,
    /// `NAME=\"VALUE\"` (a quoted value inside quoted text), `"NAME":
    /// "VALUE"` and `NAME: VALUE`, `NAME "VALUE"` (a live check's "has NAME
    /// \"VALUE\" in /proc/…/environ"), and the command line's `--flag VALUE`,
    /// `--flag=VALUE`. NAME is an upper-case variable name; an unquoted value
    /// runs to the next whitespace, comma, semicolon, quote or closing bracket.
    pub fn text(&self, s: &str) -> String {
        let spans = self.secret_spans(s);
        if spans.is_empty() {
            return s.to_string();
        }
        let mut out = String::with_capacity(s.len());
        let mut at = 0;
        for r in spans {
            out.push_str(&s[at..r.start]);
            out.push_str(REDACTED);
            at = r.end;
        }
        out.push_str(&s[at..]);
        out
    }

    /// Free text from a process whose own environment is `env` (its log
    /// tail), with every secret value hidden whole (issue 32: a value holding
    /// a separator leaked its tail, `MY_TOKEN=[redacted]],LEAKA`). The known
    /// values of `env`'s secret variables are found first, as whole strings
    /// and longest first, whatever characters they hold: anywhere when at
    /// least [`MIN_BARE_VALUE`] characters long (an engine that prints "using
    /// token hf_…" names no variable), and, whatever their length, wherever
    /// their name introduces them (`NAME=VALUE`, `NAME: VALUE`, quoted); the
    /// [`Redactor::text`] rules then catch any other secret it names. Where
    /// the two overlap, their union is hidden, so no tail is left over.
    pub fn text_with_env<'e>(&self, s: &str, env: impl IntoIterator<Item = (&'e str, &'e str)>) -> String {
        // (needle, bytes of it to keep: the name and separator before the value).
        let mut needles: Vec<(String, usize)> = Vec::new();
        for (name, value) in env {
            if value.is_empty() || !self.is_secret(name) {
                continue;
            }
            if value.chars().count() >= MIN_BARE_VALUE {
                needles.push((value.to_string(), 0));
            }
            for sep in ["=", "=\"", "='", "=\\\"", ": ", ":", ": \"", " \""] {
                needles.push((format!("{name}{sep}{value}"), name.len() + sep.len()));
            }
        }
        // Longest value first; a value inside a longer one is not a tail of it.
        needles.sort_by(|(a, ka), (b, kb)| (b.len() - kb).cmp(&(a.len() - ka)).then(b.len().cmp(&a.len())));
        let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
        for (needle, keep) in &needles {
            let mut from = 0;
            while let Some(o) = s[from..].find(needle.as_str()) {
                let at = from + o;
                let value = at + keep..at + needle.len();
                if !spans.iter().any(|r| r.start < value.end && value.start < r.end) {
                    spans.push(value);
                }
                // Needles start and end on character boundaries.
                from = at + needle.len();
            }
        }
        spans.extend(self.secret_spans(s));
        spans.sort_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<usize>> = Vec::with_capacity(spans.len());
        for r in spans {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let mut out = String::with_capacity(s.len());
        let mut at = 0;
        for r in merged {
            out.push_str(&s[at..r.start]);
            out.push_str(REDACTED);
            at = r.end;
        }
        out.push_str(&s[at..]);
        out
    }

    /// Byte ranges of the secret values in `s`, in order, disjoint.
    fn secret_spans(&self, s: &str) -> Vec<std::ops::Range<usize>> {
        let b = s.as_bytes();
        let name_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let stop = |c: char| c.is_whitespace() || matches!(c, ',' | ';' | '"' | '\'' | ')' | ']' | '}');
        let mut spans = Vec::new();
        let mut i = 0;
        while i < b.len() {
            // Bytes, not `&s[i..]`: `i` may sit inside a multi-byte character.
            let starts_token = (name_char(b[i]) || b[i..].starts_with(b"--"))
                && (i == 0 || !(name_char(b[i - 1]) || b[i - 1] == b'-'));
            if !starts_token {
                i += 1;
                continue;
            }
            let flag = b[i..].starts_with(b"--");
            let mut j = if flag { i + 2 } else { i };
            while j < b.len() && (name_char(b[j]) || (flag && b[j] == b'-')) {
                j += 1;
            }
            let name = &s[i..j];
            let secret = if flag {
                name.len() > 2 && self.is_secret_flag(name)
            } else {
                is_env_name(name) && self.is_secret(name)
            };
            if !secret {
                i = j.max(i + 1);
                continue;
            }
            // The separator: `=` or `:` (a quoted key's closing quote
            // first), or spaces before a quoted value (or any value after
            // a flag).
            let mut k = j;
            if b[k..].starts_with(b"\\\"") {
                k += 2;
            } else if b[k..].starts_with(b"\"") || b[k..].starts_with(b"'") {
                k += 1;
            }
            let spaced = |mut k: usize| {
                while k < b.len() && b[k] == b' ' {
                    k += 1;
                }
                k
            };
            let (value_at, bare_ok) = if b[k..].starts_with(b"=") || b[k..].starts_with(b":") {
                (spaced(k + 1), true)
            } else if b[k..].starts_with(b" ") {
                (spaced(k), flag)
            } else {
                i = j;
                continue;
            };
            let rest = &s[value_at..];
            let closing = |open: usize, close: &str| {
                let inner = value_at + open;
                let mut end = inner;
                loop {
                    match s[end..].find(close) {
                        Some(o) if close == "\"" && o > 0 && s.as_bytes()[end + o - 1] == b'\\' => end += o + 1,
                        Some(o) => break (inner, end + o),
                        None => break (inner, s.len()),
                    }
                }
            };
            let (vs, ve) = if rest.starts_with("\\\"") {
                closing(2, "\\\"")
            } else if rest.starts_with('"') {
                closing(1, "\"")
            } else if rest.starts_with('\'') {
                closing(1, "'")
            } else if bare_ok {
                (value_at, value_at + rest.find(stop).unwrap_or(rest.len()))
            } else {
                i = j;
                continue;
            };
            // A value already redacted (a second pass: the orchestrator's
            // view of a capture the agent redacted) is left as it is; the
            // bare value stops at `]`, and `[redacted` was redacted again
            // to `[redacted]]` (issue 48, second red-team pass).
            if ve > vs && !s[vs..].starts_with(REDACTED) {
                spans.push(vs..ve);
            }
            i = ve.max(j);
        }
        spans
    }

    /// Redacts a JSON document in place (see the module doc for the shapes),
    /// then removes every value found secret anywhere in it from every
    /// other string too: a secret named once (`set_env`, a live check's
    /// `NAME="VALUE"`) is never repeated in a form no rule names (a live
    /// check's "…, expected \"VALUE\"").
    pub fn json(&self, v: &mut Value) {
        let mut found = Vec::new();
        self.collect(v, &mut found);
        self.json_forms(v);
        // Short values ("1", "on") would erase ordinary words and numbers.
        found.retain(|s| s.chars().count() >= 4 && s != REDACTED);
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found.dedup();
        if !found.is_empty() {
            scrub(v, &found);
        }
    }

    /// The secret values of a document, as [`Redactor::json`] would redact them.
    fn collect(&self, v: &Value, found: &mut Vec<String>) {
        match v {
            Value::String(s) => found.extend(self.secret_spans(s).into_iter().map(|r| s[r].to_string())),
            Value::Array(items) => items.iter().for_each(|i| self.collect(i, found)),
            Value::Object(map) => {
                for (k, val) in map {
                    if let Some(flags) = names_kind(k) {
                        self.each_secret(val, flags, |s| found.push(s.to_string()));
                    }
                    self.collect(val, found);
                }
            }
            _ => {}
        }
    }

    fn json_forms(&self, v: &mut Value) {
        match v {
            Value::String(s) if s.contains(['=', ':', ' ']) => *s = self.text(s),
            Value::Array(items) => items.iter_mut().for_each(|i| self.json_forms(i)),
            Value::Object(map) => {
                for (k, val) in map.iter_mut() {
                    if let Some(flags) = names_kind(k) {
                        self.env_value(val, flags);
                    }
                    self.json_forms(val);
                }
            }
            _ => {}
        }
    }

    /// Serialises `value` as compact JSON, redacted exactly as
    /// [`Redactor::json`] would, without building a `serde_json::Value`:
    /// a fleet-wide `status` is megabytes, and the intermediate tree and
    /// the walk over it cost more than the serialisation itself. Should the
    /// document contain a secret at all, or a key ending in `env` or `args`
    /// (whose shape matters), it falls back to the `Value` walk.
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

    fn secret_name(&self, name: &str, flags: bool) -> bool {
        if flags {
            self.is_secret_flag(name)
        } else {
            self.is_secret(name)
        }
    }

    /// Calls `f` with each secret value of an environment (or of a set of
    /// command-line flags) as a map or as a list of `{key|name, value}`.
    fn each_secret<'v>(&self, v: &'v Value, flags: bool, mut f: impl FnMut(&'v str)) {
        match v {
            Value::Object(map) => {
                for (name, val) in map {
                    if self.secret_name(name, flags)
                        && let Some(s) = val.as_str()
                    {
                        f(s);
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    let Value::Object(entry) = item else { continue };
                    let name = entry.get("key").or_else(|| entry.get("name")).and_then(Value::as_str);
                    if name.is_some_and(|n| self.secret_name(n, flags))
                        && let Some(s) = entry.get("value").and_then(Value::as_str)
                    {
                        f(s);
                    }
                }
            }
            _ => {}
        }
    }

    /// An environment (or a set of flags) as a map or as a list of
    /// `{key|name, value}`: its secret values replaced.
    fn env_value(&self, v: &mut Value, flags: bool) {
        match v {
            Value::Object(map) => {
                for (name, val) in map.iter_mut() {
                    if self.secret_name(name, flags) && !val.is_null() {
                        *val = Value::String(REDACTED.into());
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    let Value::Object(entry) = item else { continue };
                    let name = entry.get("key").or_else(|| entry.get("name")).and_then(Value::as_str);
                    if name.is_some_and(|n| self.secret_name(n, flags))
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

/// A key whose value names variables (`env`, `set_env`: `Some(false)`) or
/// command-line flags (`args`, `set_args`: `Some(true)`).
fn names_kind(key: &str) -> Option<bool> {
    let k = key.as_bytes();
    let ends = |suffix: &[u8]| k.len() >= suffix.len() && k[k.len() - suffix.len()..].eq_ignore_ascii_case(suffix);
    if ends(b"env") {
        Some(false)
    } else if ends(b"args") {
        Some(true)
    } else {
        None
    }
}

/// Every occurrence of a known secret in every string replaced.
fn scrub(v: &mut Value, secrets: &[String]) {
    match v {
        Value::String(s) => {
            for secret in secrets {
                if s.contains(secret.as_str()) {
                    *s = s.replace(secret.as_str(), REDACTED);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| scrub(i, secrets)),
        Value::Object(map) => map.values_mut().for_each(|i| scrub(i, secrets)),
        _ => {}
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
        // A key naming variables or flags, or a secret in any string: the
        // whole document goes through the `Value` walk (which also scrubs a
        // found secret from every other string).
        if self.in_key {
            if names_kind(s).is_some() {
                self.env_key_seen.set(true);
            }
        } else if !self.redactor.secret_spans(s).is_empty() {
            self.env_key_seen.set(true);
        }
        escape_into(w, s)?;
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

    /// Issue 48's second red-team pass: text an agent already redacted,
    /// redacted again on its way out, read `[redacted]]` (and `]]]` a pass
    /// later): a bare value stopped at `]`. A second pass changes nothing.
    #[test]
    fn redacting_twice_changes_nothing() {
        let r = Redactor::default();
        for t in [
            "--api-key [redacted] http://cu:[redacted]@child.local/x",
            "HF_TOKEN=[redacted] API_KEY: [redacted], x",
            "--api-key hf_secret_value_1 DB_PASSWORD=p4ss",
        ] {
            let once = r.text(t);
            assert_eq!(r.text(&once), once, "{t}");
            assert!(!once.contains("]]"), "{once}");
        }
    }

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

    /// Issue 16, finding 9: `gate --json` showed `HF_TOKEN="hf_…"` in a live
    /// check's observations — a quoted value escaped the `NAME=VALUE` rule.
    #[test]
    fn quoted_and_other_forms() {
        let r = Redactor::default();
        let cases = [
            ("pid 7: HF_TOKEN=\"hf_abc\"", "pid 7: HF_TOKEN=\"[redacted]\""),
            ("HF_TOKEN='hf_abc' x", "HF_TOKEN='[redacted]' x"),
            ("env HF_TOKEN=\\\"hf_abc\\\" set", "env HF_TOKEN=\\\"[redacted]\\\" set"),
            ("{\"HF_TOKEN\": \"hf_abc\"}", "{\"HF_TOKEN\": \"[redacted]\"}"),
            ("HF_TOKEN: hf_abc", "HF_TOKEN: [redacted]"),
            (
                "pid 7 has HF_TOKEN \"hf_abc\" in /proc/7/environ",
                "pid 7 has HF_TOKEN \"[redacted]\" in /proc/7/environ",
            ),
            ("serve --api-key sk-123 --port 8", "serve --api-key [redacted] --port 8"),
            ("--hf-token=hf_abc", "--hf-token=[redacted]"),
            ("HF_TOKEN=\"a\\\"b\" tail", "HF_TOKEN=\"[redacted]\" tail"),
            // Settings that only look like credentials stay.
            (
                "--max-num-batched-tokens 8192 max_tokens=8",
                "--max-num-batched-tokens 8192 max_tokens=8",
            ),
            ("HF_TOKEN absent, é HF_TOKEN", "HF_TOKEN absent, é HF_TOKEN"),
        ];
        for (text, want) in cases {
            assert_eq!(r.text(text), want, "{text}");
        }
    }

    /// A secret named once in a document is scrubbed from every other
    /// string of it, whatever the form there (a live check's "expected").
    #[test]
    fn a_secret_found_once_is_gone_everywhere() {
        let r = Redactor::default();
        let doc = json!({
            "change": {"set_env": {"HF_TOKEN": "hf_secret1"}, "set_args": {"--api-key": "sk-live-9"}},
            "live": [{"observed": ["pid 3: --api-key sk-live-9"], "problems": ["decode-0: pid 3 has HF_TOKEN absent in /proc/3/environ, expected Some(hf_secret1)"]}],
        });
        for out in [
            {
                let mut v = doc.clone();
                r.json(&mut v);
                v.to_string()
            },
            r.to_json_string(&doc).unwrap(),
        ] {
            assert!(!out.contains("hf_secret1") && !out.contains("sk-live-9"), "{out}");
            assert!(out.contains("pid 3"), "{out}");
        }
    }

    proptest::proptest! {
        /// Fuzz: a secret in every form the reports contain, anywhere in a
        /// report, never survives either serialiser.
        #[test]
        fn no_form_leaks_a_secret(
            secret in "[A-Za-z0-9_./+:-]{6,40}",
            name in proptest::sample::select(vec!["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "OPENAI_API_KEY"]),
            flag in proptest::sample::select(vec!["--api-key", "--hf-token", "--db-password"]),
            form in 0usize..11,
            noise in "[a-z ]{0,12}",
            place in 0usize..4,
        ) {
            let r = Redactor::default();
            let text = match form {
                0 => format!("{name}={secret}"),
                1 => format!("pid 3: {name}={secret:?}"),
                2 => format!("{name}='{secret}'"),
                3 => format!("{{\"{name}\": \"{secret}\"}}"),
                4 => format!("{name}: {secret}"),
                5 => format!("pid 3 has {name} {secret:?} in /proc/3/environ"),
                6 => format!("pid 3: {flag} {secret}"),
                7 => format!("{flag}={secret}"),
                8 => format!("{flag} \"{secret}\" (pid 3)"),
                9 => format!("started with {name}=\\\"{secret}\\\""),
                _ => format!("{:?}", format!("{name}={secret}")),
            };
            let text = format!("{noise} {text}, {noise}");
            let doc = match place {
                0 => json!({"reasons": [text]}),
                1 => json!({"live": [{"observed": [text], "ok": true}]}),
                2 => json!({"detail": text, "n": 1}),
                _ => json!({"a": {"b": [{"c": text}]}}),
            };
            let mut walked = doc.clone();
            r.json(&mut walked);
            let walked = walked.to_string();
            let streamed = r.to_json_string(&doc).unwrap();
            proptest::prop_assert!(!walked.contains(&secret), "{}", walked);
            proptest::prop_assert!(!streamed.contains(&secret), "{}", streamed);
        }
    }

    /// Issue 32 (secrets): a known value is hidden whole, longest first,
    /// whatever it holds; a short one where its name introduces it.
    #[test]
    fn text_with_env_hides_whole_values() {
        let r = Redactor::default();
        let env = [
            ("MY_TOKEN", "s3cr3t],LEAKA"),
            ("API_KEY", "a b"),
            ("HF_TOKEN", "hf_abcdef"),
            ("HF_TOKEN_2", "hf_abcdef_more"),
            ("MODEL", "shown, too"),
        ];
        let cases = [
            ("MY_TOKEN=s3cr3t],LEAKA x", "MY_TOKEN=[redacted] x"),
            ("got 's3cr3t],LEAKA'", "got '[redacted]'"),
            ("API_KEY=a b, a b", "API_KEY=[redacted], a b"),
            ("API_KEY=\"a b\"", "API_KEY=\"[redacted]\""),
            ("hf_abcdef_more/hf_abcdef", "[redacted]/[redacted]"),
            ("MODEL=shown, too OTHER_KEY=v", "MODEL=shown, too OTHER_KEY=[redacted]"),
        ];
        for (text, want) in cases {
            assert_eq!(r.text_with_env(text, env), want, "{text}");
        }
        // Without an environment it is `text`.
        let t = "set HF_TOKEN=hf_abc, KNOB=512 and 'API_KEY=x y'";
        assert_eq!(r.text_with_env(t, []), r.text(t));
    }

    proptest::proptest! {
        /// Fuzz: a known secret value, whatever characters it holds, never
        /// survives in part where its name introduces it, nor anywhere once
        /// it is long enough.
        #[test]
        fn a_known_value_never_leaks_in_part(
            body in "[ -~]{0,30}",
            form in 0usize..6,
            noise in "[a-z ]{0,12}",
        ) {
            let r = Redactor::default();
            // `Q` appears nowhere else in the text.
            let secret = format!("Q{body}");
            let env = [("MY_TOKEN", secret.as_str()), ("MODEL", "m")];
            let text = match form {
                0 => format!("MY_TOKEN={secret}"),
                1 => format!("MY_TOKEN=\"{secret}\""),
                2 => format!("MY_TOKEN='{secret}'"),
                3 => format!("MY_TOKEN: {secret}"),
                4 => format!("pid 3 has MY_TOKEN \"{secret}\""),
                _ => format!("using {secret}"),
            };
            let out = r.text_with_env(&format!("{noise} {text}, {noise}"), env);
            if form < 5 || secret.chars().count() >= MIN_BARE_VALUE {
                proptest::prop_assert!(!out.contains(&secret), "{}", out);
            }
        }
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
