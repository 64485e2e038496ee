//! Secrets hidden by what they look like, not only by what they are
//! (issue 48, item 2).
//!
//! [`crate::redact::Redactor`] hides the values a unit was given (its
//! secret environment variables, wherever they appear) and the values of
//! upper-case `NAME=VALUE` and `--secret-flag VALUE`. A red-team pass found
//! what that misses, verbatim in journaled evidence captures: SGLang's own
//! `server_args=ServerArgs(api_key='…', hf_token='hf_…')` line, a JSON
//! `"api_key": "…"`, an `Authorization: Bearer …` header, and a
//! `postgres://user:PASS@host` URL in a log tail or a command line. None of
//! these secrets was the unit's own configured value, and none was named by
//! an upper-case variable.
//!
//! [`by_shape`] hides them by shape, wherever the text came from:
//! - keys that name a secret (`api_key`, `hf_token`, `password`, `secret`,
//!   `authorization`, …; any case, `-`/`_`/`.` separated) with their value,
//!   in Python reprs `key='v'`, JSON `"key": "v"`, YAML `key: v` and
//!   `k=v` (an `Authorization` value's scheme, `Bearer`, is kept);
//! - a bare `Bearer <token>`;
//! - tokens whose own prefix says what they are (`hf_…`, `sk-…`, `ghp_…`,
//!   `github_pat_…`, `xox?-…`, `glpat-…`, AWS `AKIA…`, JWTs);
//! - URL userinfo: `scheme://user:PASS@host` keeps the user, hides the
//!   password; `scheme://TOKEN@host` (a user or token alone) is hidden whole;
//! - a flag naming a secret and its value after a space (`--db-pass V`);
//! - a value or bearer token on the line after its key (a folded header,
//!   `api_key=` then the value) — the second red-team pass;
//! - PEM private key blocks.
//!
//! It is deliberately broad: a capture read by people after a wedge loses
//! little when a non-secret value under a key named `…_key` is hidden, and
//! loses everything when a credential leaves the host. What replaces a value
//! is [`crate::redact::REDACTED`], which no rule matches again, so
//! redacting twice changes nothing.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use crate::redact::REDACTED;

/// PEM private key blocks, to their end (or the text's).
static PEM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)")
        .expect("PEM pattern")
});

/// `scheme://user:PASS@`: the password may hold `@` (the last `@` before
/// the host ends it), never whitespace, `/`, `?`, `#` or a quote.
static USERINFO: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'"]*:)(?P<pass>[^\s/?#'"]+)@"#)
        .expect("userinfo pattern")
});

/// A key naming a secret, its separator and its value. The key may be
/// quoted (`"k"`, `'k'`, `\"k\"`); its last word is the secret word, so
/// `max_new_tokens` and `tokenizer_path` are not secrets; a bare value
/// never starts with `[` or `{` (an object, or a value already redacted).
static KEY_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?x)
        (?P<pre>
          (?:^|[^A-Za-z0-9_.-])
          (?:\\?["'])?
          (?i:
            (?:[a-z0-9]+[_.-])*
            (?: api[_-]?key | apikey | access[_-]?key | secret[_-]?key | private[_-]?key
              | client[_-]?secret | auth[_-]?key | encryption[_-]?key | signing[_-]?key
              | token | secret | password | passwd | passphrase | credentials? | authorization
              | cookie | pass | pwd )
          )
          (?:\\?["'])?
          [\ \t]*[:=](?:[\ \t]*(?:\r?\n|\|)[\ \t]*|[\ \t]*)
          (?i:(?:bearer|basic|token)(?:[\ \t]*(?:\r?\n|\|)[\ \t]*|[\ \t]+))?
        )
        (?P<val>
            \\"(?:[^"\\]|\\[^"])*\\"
          | "(?:[^"\\]|\\.)*"
          | '(?:[^'\\]|\\.)*'
          | [^\s,;&)\]}'"\[{|][^\s,;&)\]}'"]*
        )"#,
    )
    .expect("key-value pattern")
});

/// A bearer token on its own (a header quoted without its name), on the
/// same line or the next (a header folded across lines; in a unit's log
/// tail the agent joins lines with " | ", which counts as a line break).
static BEARER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?P<pre>\b(?i:bearer)(?:[ \t]*(?:\r?\n|\|)[ \t]*|[ \t]+))[A-Za-z0-9._~+/-]{6,}=*")
        .expect("bearer pattern")
});

/// A command-line flag naming a secret and its value after a space
/// (`--db-pass VALUE`, `--api-key VALUE`); a value never starts with `-`
/// (the next flag) or `[` (already redacted).
static FLAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?x)
        (?P<pre>
          (?:^|\s)--?
          (?i:
            (?:[a-z0-9]+[_-])*
            (?: api[_-]?key | apikey | access[_-]?key | secret[_-]?key | private[_-]?key
              | client[_-]?secret | auth[_-]?key | token | secret | password | passwd
              | passphrase | credentials? | pass | pwd )
          )
          [\ \t]+
        )
        (?P<val> '[^']*' | "[^"]*" | [^\s\-\['"][^\s]* )"#,
    )
    .expect("flag pattern")
});

/// A URL whose userinfo is a user (or token) alone: `https://TOKEN@host`
/// (git over HTTPS with a token). Hidden whole: a user name alone is rarely
/// worth the risk.
static USER_ONLY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@:'"\[]+@"#).expect("user-only userinfo pattern")
});

/// Tokens whose prefix says what they are.
static PREFIXED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)\b(?:
            hf_[A-Za-z0-9]{12,}
          | (?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{16,}
          | github_pat_[A-Za-z0-9_]{16,}
          | sk-[A-Za-z0-9_-]{12,}
          | xox[abprs]-[A-Za-z0-9-]{10,}
          | glpat-[A-Za-z0-9_-]{16,}
          | AKIA[0-9A-Z]{16}
          | eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
        )",
    )
    .expect("token pattern")
});

/// Values under a secret key that hold nothing secret, left as they are.
fn is_empty_value(v: &str) -> bool {
    matches!(
        v,
        "None" | "null" | "nil" | "True" | "False" | "true" | "false" | "''" | "\"\"" | "\\\"\\\""
    )
}

/// A quoted value with its quotes kept and its inside replaced.
fn redact_value(val: &str) -> String {
    for q in ["\\\"", "\"", "'"] {
        if val.len() >= 2 * q.len() && val.starts_with(q) && val.ends_with(q) {
            return format!("{q}{REDACTED}{q}");
        }
    }
    REDACTED.to_owned()
}

/// `text` with every secret of a listed shape replaced by
/// [`REDACTED`] (see the module doc). Borrowed when nothing matched.
pub fn by_shape(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    let mut apply = |re: &Regex, f: &dyn Fn(&Captures) -> String| {
        if re.is_match(&out) {
            out = Cow::Owned(re.replace_all(&out, |c: &Captures| f(c)).into_owned());
        }
    };
    apply(&PEM, &|_| REDACTED.to_owned());
    apply(&USERINFO, &|c| format!("{}{REDACTED}@", &c["pre"]));
    apply(&USER_ONLY, &|c| format!("{}{REDACTED}@", &c["pre"]));
    apply(&FLAG, &|c| format!("{}{}", &c["pre"], redact_value(&c["val"])));
    apply(&KEY_VALUE, &|c| {
        let val = &c["val"];
        if is_empty_value(val) {
            c[0].to_owned()
        } else {
            format!("{}{}", &c["pre"], redact_value(val))
        }
    });
    apply(&BEARER, &|c| format!("{}{REDACTED}", &c["pre"]));
    apply(&PREFIXED, &|_| REDACTED.to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Property: each shape the red-team pass found leaking is hidden, its
    // context kept.
    #[test]
    fn the_red_team_shapes_are_hidden() {
        let cases = [
            (
                "server_args=ServerArgs(model_path='/m', api_key='s3cr3t-key-value', hf_token='hf_AbCdEfGhIjKlMnOpQrSt', port=30000)",
                "server_args=ServerArgs(model_path='/m', api_key='[redacted]', hf_token='[redacted]', port=30000)",
            ),
            (
                r#"{"model": "m", "api_key": "plain-secret-1", "port": 1}"#,
                r#"{"model": "m", "api_key": "[redacted]", "port": 1}"#,
            ),
            (
                "> Authorization: Bearer eyabc.DEF-ghi_123 sent",
                "> Authorization: Bearer [redacted] sent",
            ),
            (
                "db at postgres://app:PaSsW0rd@db.internal:5432/x up",
                "db at postgres://app:[redacted]@db.internal:5432/x up",
            ),
            (
                "--router http://user:p@ss@router:8080/v1 --x",
                "--router http://user:[redacted]@router:8080/v1 --x",
            ),
            // The second red-team pass: split across lines, a token-only
            // URL, `pwd=`, `DB_PASS=`, `--db-pass VALUE`.
            (
                "> Authorization: Bearer\nSPLITTOK_line2 sent",
                "> Authorization: Bearer\n[redacted] sent",
            ),
            ("api_key=\n'SPLITKEY2_s2'", "api_key=\n'[redacted]'"),
            // The same in a log tail as the agent joins it (lines with " | ").
            (
                "> Authorization: Bearer | SPLITTOK_line2 | api_key= | 'SPLITKEY2_s2' | next",
                "> Authorization: Bearer | [redacted] | api_key= | '[redacted]' | next",
            ),
            (
                "clone https://USERONLYTOKEN_z1@git.example.com/repo done",
                "clone https://[redacted]@git.example.com/repo done",
            ),
            (
                "pwd=PWDVAL_p2 DB_PASS=DBPASSVAL_p3",
                "pwd=[redacted] DB_PASS=[redacted]",
            ),
            (
                "serve --db-pass DBPASSFLAG_p4 --port 1 --api-key 'k k'",
                "serve --db-pass [redacted] --port 1 --api-key '[redacted]'",
            ),
            (
                "--bypass-cache 1 --password-file /x",
                "--bypass-cache 1 --password-file /x",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(by_shape(text), want, "{text}");
        }
    }

    // Property: the other forms of a key naming a secret (YAML, k=v, an
    // escaped JSON inside a string, upper case, a header name) are hidden;
    // settings that merely contain the word (`max_new_tokens`,
    // `tokenizer_path`) and empty values are not.
    #[test]
    fn secret_keys_in_every_form() {
        let cases = [
            ("password: hunter22\nnext: 1", "password: [redacted]\nnext: 1"),
            ("db_password=abc&user=u", "db_password=[redacted]&user=u"),
            (r#"{\"secret\": \"xyz\"}"#, r#"{\"secret\": \"[redacted]\"}"#),
            ("X-Api-Key: k123456", "X-Api-Key: [redacted]"),
            ("'access_token': 'tok'", "'access_token': '[redacted]'"),
            ("HF_TOKEN=[redacted] ok", "HF_TOKEN=[redacted] ok"),
            (
                "max_new_tokens=128 tokenizer_path='/t' token_id=5",
                "max_new_tokens=128 tokenizer_path='/t' token_id=5",
            ),
            ("api_key=None, hf_token=''", "api_key=None, hf_token=''"),
            ("credentials: {", "credentials: {"),
            ("using sk-proj-abcdefghijklmnop now", "using [redacted] now"),
            ("curl -H 'bearer abcdefgh'", "curl -H 'bearer [redacted]'"),
        ];
        for (text, want) in cases {
            assert_eq!(by_shape(text), want, "{text}");
        }
    }

    // Property: text without a secret is borrowed, unchanged; redacting
    // twice is redacting once.
    #[test]
    fn plain_text_is_untouched_and_redaction_is_idempotent() {
        let plain = "decode batch 12, #running-req: 3, gen throughput (token/s): 512.0 http://router:8080/x";
        assert!(matches!(by_shape(plain), Cow::Borrowed(_)));
        let once = by_shape("api_key='a' b http://u:p@h/ Bearer abcdefgh hf_abcdefghijklmnop").into_owned();
        assert_eq!(by_shape(&once), once);
    }

    fn secret() -> impl Strategy<Value = String> {
        "[A-Za-z0-9]{16,32}"
    }

    /// Each listed shape with `s` as its secret part.
    fn shaped(shape: usize, s: &str, key: &str) -> String {
        match shape {
            0 => format!("{key}='{s}'"),
            1 => format!("\"{key}\": \"{s}\""),
            2 => format!("{key}: {s}"),
            3 => format!("{key}={s}"),
            4 => format!("Authorization: Bearer {s}"),
            5 => format!("hf_{s}"),
            6 => format!("sk-{s}"),
            7 => format!("postgres://user:{s}@db:5432/app"),
            8 => format!("https://u:{s}@host/path"),
            _ => format!("Bearer {s}"),
        }
    }

    proptest! {
        // Property: no secret of a listed shape survives, whatever text
        // surrounds it.
        #[test]
        fn no_listed_shape_survives(
            s in secret(),
            shape in 0usize..10,
            key in prop::sample::select(vec!["api_key", "hf_token", "password", "secret", "token", "API-KEY", "client_secret"]),
            before in "[ -~]{0,20}",
            after in prop::sample::select(vec!["", " ", ", x=1", ")", "\n", " | next line"]),
        ) {
            let text = format!("{before} {}{after}", shaped(shape, &s, key));
            let out = by_shape(&text);
            prop_assert!(!out.contains(&s), "{text:?} -> {out:?}");
        }
    }
}
