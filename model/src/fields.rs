//! The bounds on what a request may name (issue 32): one rule each for an
//! idempotency key and for a pair, host or unit name, shared by the CLI
//! (which checks before sending) and the gRPC edge (which checks every
//! request, whoever sent it). A value out of bounds is refused in one line
//! that never repeats the value whole: a 100 KB name quoted back in a
//! `grpc-message` header is itself the failure ("h2 protocol error").

/// The longest `request_id`, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// The longest pair, host or unit name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// How much of a refused value an error message shows.
const SHOWN_CHARS: usize = 48;

/// A value for an error message: quoted and escaped, and cut after a few
/// dozen characters with its length said.
pub fn shown(s: &str) -> String {
    if s.chars().count() <= SHOWN_CHARS {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}… ({} bytes)", s.len())
}

/// An idempotency key: 1 to 128 printable ASCII characters, no spaces (the
/// edge takes an empty one as "none" before asking this). The error is the
/// problem in words, without the field's name.
pub fn check_request_id(s: &str) -> Result<(), FieldError> {
    const RULE: &str = "expected 1 to 128 printable ASCII characters without spaces";
    if s.is_empty() {
        return Err(FieldError::Empty { rule: RULE });
    }
    if s.len() > MAX_REQUEST_ID_BYTES {
        return Err(FieldError::TooLong {
            bytes: s.len(),
            rule: RULE,
        });
    }
    match s.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
        Some((at, c)) => Err(FieldError::Char {
            shown: shown(s),
            c,
            at,
            rule: RULE,
        }),
        None => Ok(()),
    }
}

pub fn check_name(s: &str) -> Result<(), FieldError> {
    const RULE: &str = "expected 1 to 128 letters, digits, '.', '_' and '-'";
    if s.is_empty() {
        return Err(FieldError::Empty { rule: RULE });
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(FieldError::TooLong {
            bytes: s.len(),
            rule: RULE,
        });
    }
    if let Some((at, c)) = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(FieldError::Char {
            shown: shown(s),
            c,
            at,
            rule: RULE,
        });
    }
    if s == "." || s == ".." {
        return Err(FieldError::Dots {
            name: s.to_string(),
            rule: RULE,
        });
    }
    Ok(())
}

/// Why a request id or a name is refused (one line; the field it is in is
/// the caller's to name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("empty: {rule}")]
    Empty { rule: &'static str },
    #[error("{bytes} bytes: {rule}")]
    TooLong { bytes: usize, rule: &'static str },
    #[error("{shown} has {c:?} at byte {at}: {rule}")]
    Char {
        shown: String,
        c: char,
        at: usize,
        rule: &'static str,
    },
    #[error("{name:?} is not a name: {rule}")]
    Dots { name: String, rule: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_bounded_printable_ascii() {
        check_request_id("change-4711").unwrap();
        check_request_id(&"x".repeat(128)).unwrap();
        let e = check_request_id(&"x".repeat(1 << 20)).unwrap_err().to_string();
        assert_eq!(
            e,
            "1048576 bytes: expected 1 to 128 printable ASCII characters without spaces"
        );
        for bad in ["has space", "tab\t", "nul\0", "é", ""] {
            let e = check_request_id(bad).unwrap_err().to_string();
            assert!(e.ends_with("printable ASCII characters without spaces"), "{e}");
        }
        assert!(
            check_request_id("a\nb")
                .unwrap_err()
                .to_string()
                .starts_with("\"a\\nb\" has '\\n' at byte 1")
        );
    }

    #[test]
    fn names_are_bounded_and_plain() {
        for ok in ["demo", "pair-a", "gpu-1.example", "decode_0", "a..b"] {
            check_name(ok).unwrap();
        }
        for bad in ["", ".", "..", "demo#gate", "../../etc", "a b", "a\0", "ü"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let e = check_name(&"p".repeat(100 * 1024)).unwrap_err().to_string();
        assert_eq!(e, "102400 bytes: expected 1 to 128 letters, digits, '.', '_' and '-'");
        let e = check_name(&format!("{}#", "a".repeat(100))).unwrap_err().to_string();
        assert!(
            e.contains("… (101 bytes) has '#' at byte 100"),
            "the value is not repeated whole: {e}"
        );
    }
}
