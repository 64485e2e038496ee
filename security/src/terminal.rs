//! Daemon logs that cannot act on a terminal (issue 48, second red-team
//! pass). The orchestrator's and the agent's own log lines quote engines:
//! a stack reading's innermost frame, an exited unit's log tail, a probe's
//! error. An engine that prints OSC 52 (the clipboard), OSC 0 (the window
//! title) or `ESC [2J` reached the terminal of anyone who ran a daemon in
//! the foreground or tailed its log. The CLI escapes what it prints
//! (`pdwarden_client::say_to`); the daemons write their logs through
//! [`Escaping`], which shows every control character but newline and tab
//! as `\u00XX`. Their logs are therefore written without colour.

use std::io::{self, Write};

/// Whether `c` is shown escaped.
fn needs(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` with every control character but newline and tab (C0, DEL,
/// C1) written as `\u00XX`.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    if !text.chars().any(needs) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if needs(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A writer that passes whole log lines through [`escape_controls`]
/// (bytes that are not UTF-8 become U+FFFD). The log formatter writes each
/// event with one `write_all`.
pub struct Escaping<W>(pub W);

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match std::str::from_utf8(buf) {
            Ok(text) if !text.chars().any(needs) => self.0.write_all(buf),
            _ => self
                .0
                .write_all(escape_controls(&String::from_utf8_lossy(buf)).as_bytes()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Property: OSC 52, OSC 0, a screen clear, a raw C1 CSI and a carriage
    // return reach the log escaped; newline, tab and text pass as they are.
    #[test]
    fn a_log_line_cannot_act_on_a_terminal() {
        let mut out = Escaping(Vec::new());
        out.write_all(b"reading=evil \x1b]52;c;RlJBTUU=\x07 \x1b]0;T\x07 \x1b[2J \xc2\x9b31m \x9b raw\r\tend\n")
            .unwrap();
        let text = String::from_utf8(out.0).unwrap();
        assert_eq!(
            text,
            "reading=evil \\u001b]52;c;RlJBTUU=\\u0007 \\u001b]0;T\\u0007 \\u001b[2J \\u009b31m \u{fffd} raw\\u000d\tend\n"
        );
        assert!(!text.bytes().any(|b| b == 0x1b || b == 0x07));
        let mut plain = Escaping(Vec::new());
        plain.write_all("état ok\n".as_bytes()).unwrap();
        assert_eq!(plain.0, "état ok\n".as_bytes());
    }
}
