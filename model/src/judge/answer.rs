//! The client layer's reading of one answer (DESIGN.md 16): what an answer
//! that arrived says against itself — an error event inside the stream, a
//! finish reason that is not a completion, too few or too many tokens.
//! Shared by the probes and every suite step, so one rule reads the client
//! layer; the lowest floor of the judges, importing none of them.

/// The finish reasons that say an answer ended as asked: at a stop
/// condition or at `max_tokens`. Anything else (`abort`, `error`, none at
/// all on a short answer) is an answer cut short.
pub const COMPLETE_FINISH_REASONS: [&str; 2] = ["stop", "length"];

/// What an answer that arrived says against itself: an error event inside
/// the stream, a finish reason of `abort` or `error`, or fewer tokens than
/// asked for without `stop` or `length` (a stream cut short). `None` for an
/// answer complete as far as the client can tell. Shared by the probes and
/// every suite step, so one rule reads the client layer.
pub fn answer_error(tokens: u32, tokens_asked: u32, finish_reason: &str, stream_error: &str) -> Option<String> {
    if !stream_error.is_empty() {
        return Some(format!(
            "an error event inside the stream after {tokens} token{}: {stream_error}",
            if tokens == 1 { "" } else { "s" }
        ));
    }
    if matches!(finish_reason, "abort" | "error") {
        return Some(format!(
            "finish_reason \"{finish_reason}\" after {tokens} of {tokens_asked} tokens: the engine ended it, not the request"
        ));
    }
    if tokens_asked > 0 && tokens > tokens_asked {
        return Some(format!(
            "a runaway answer: {tokens} tokens for max_tokens {tokens_asked} (the engine or router ignores max_tokens)"
        ));
    }
    if tokens_asked > 0 && tokens < tokens_asked && !COMPLETE_FINISH_REASONS.contains(&finish_reason) {
        let why = if finish_reason.is_empty() {
            "no finish_reason".to_string()
        } else {
            format!("finish_reason \"{finish_reason}\"")
        };
        return Some(format!(
            "a short answer: {tokens} of {tokens_asked} tokens asked for, with {why} (neither stop nor length)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    /// Issue 32: more tokens than asked for is a finding (the stream was
    /// cut at the agent), never an answer.
    #[test]
    fn more_tokens_than_asked_is_a_runaway_answer() {
        let e = super::answer_error(73, 8, "", "").expect("a runaway is an error");
        assert_eq!(
            e,
            "a runaway answer: 73 tokens for max_tokens 8 (the engine or router ignores max_tokens)"
        );
        assert_eq!(super::answer_error(8, 8, "length", ""), None);
        assert_eq!(
            super::answer_error(3, 0, "", ""),
            None,
            "nothing asked: nothing to compare"
        );
    }
}
