//! The verification suite's requests (issue 4): long streamed generations,
//! multi-turn conversations, bursts of concurrent probes and abort storms,
//! sent through the pair's router from the router's host.
//!
//! This module only gathers raw samples — every token's arrival time, every
//! request's outcome — and returns them; judging them against budgets and
//! history is the orchestrator's (DESIGN.md 3). Streams are read to the end,
//! not just to the first chunk: a decode that freezes mid-stream shows up as
//! silence between tokens (Dynamo's canary reads only the first chunk and
//! misses it). Every request carries the probe tags.

use std::time::Duration;

use futures::StreamExt;
use pdwarden_proto::v1::{
    ChatProbe, ProbeOutcome, SuiteAbortStorm, SuiteConcurrency, SuiteLongGeneration, SuiteMultiTurn,
    SuiteRequestSample, SuiteStepRequest, SuiteStepResult, suite_step_request::Step,
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checks::{
    PROBE_HEADER, REQUEST_ID_PREFIX, chat_probe, error_chain, error_message_of, finish_reason_of, is_failed_finish,
};

/// The longest SSE event accepted: a token chunk is a few hundred bytes; a
/// stream that never sends an event separator must not grow memory forever.
pub(crate) const MAX_SSE_EVENT_BYTES: usize = 1 << 20;

/// What a chat-completion SSE stream said, event by event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A chunk carrying generated text (one token, for SGLang-like engines).
    Content(String),
    /// A chunk's non-null `choices[0].finish_reason`: the string, or an
    /// object's `type` (SGLang's `{"type": "abort", …}`). After the
    /// chunk's content, when it carries both.
    Finish(String),
    /// An error event inside the stream, by its message: SGLang's
    /// serving_chat.py sends `data: {"error": {"message": …}}` (then
    /// `[DONE]`) for a request aborted mid-generation; vLLM `{"error": …}`
    /// or an ErrorResponse `{"object": "error", "message": …}`.
    Error(String),
    /// `data: [DONE]`.
    Done,
}

/// Removes every complete event (`…\n\n`) from the front of `buf` and returns
/// the ones that matter; events without content, finish reason or error
/// (role, usage chunks, comments, garbage) are skipped. An event's `data:`
/// lines are joined, as SSE defines. Pure, so it is fuzzed directly:
/// whatever a broken engine sends, this never panics.
pub fn drain_sse_events(buf: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let event: String = buf.drain(..end + 2).collect();
        let mut data_lines = event
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("data:"))
            .peekable();
        if data_lines.peek().is_none() {
            continue;
        }
        let data = data_lines.collect::<Vec<_>>().join("\n");
        let data = data.trim();
        if data == "[DONE]" {
            out.push(SseEvent::Done);
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(message) = error_message_of(&v) {
            out.push(SseEvent::Error(message));
            continue;
        }
        if let Some(piece) = v.pointer("/choices/0/delta/content").and_then(Value::as_str)
            && !piece.is_empty()
        {
            out.push(SseEvent::Content(piece.to_string()));
        }
        if let Some((reason, _)) = v.pointer("/choices/0/finish_reason").and_then(finish_reason_of) {
            out.push(SseEvent::Finish(reason));
        }
    }
    out
}

/// Runs one suite step against `base_url` (the router) and returns its
/// samples. `cut` ends its requests where they are (each cut request is a
/// timeout, with what it got: the orchestrator proved that the engines do
/// not progress, issue 47); the abort storm is not cut (its requests are
/// abandoned on purpose).
pub async fn run_step(
    http: &reqwest::Client,
    base_url: &str,
    command_id: &str,
    req: SuiteStepRequest,
    cut: &CancellationToken,
) -> SuiteStepResult {
    let (step, samples) = match req.step {
        Some(Step::LongGeneration(s)) => ("long_generation", vec![long_generation(http, base_url, &s, cut).await]),
        Some(Step::MultiTurn(s)) => ("multi_turn", multi_turn(http, base_url, &s, cut).await),
        Some(Step::Concurrency(s)) => ("concurrency", concurrency(http, base_url, &s, cut).await),
        Some(Step::AbortStorm(s)) => ("abort_storm", abort_storm(http, base_url, &s).await),
        None => ("none", vec![error_sample(0, "suite step request has no step".into())]),
    };
    SuiteStepResult {
        command_id: command_id.to_string(),
        unit: req.unit,
        step: step.into(),
        samples,
    }
}

/// How a request cut by `CutSuiteStep` says so in its error.
pub const CUT: &str = "cut by the orchestrator (no engine of the pair progressed)";

fn error_sample(index: u32, error: String) -> SuiteRequestSample {
    SuiteRequestSample {
        index,
        outcome: ProbeOutcome::Error as i32,
        error,
        ..Default::default()
    }
}

fn chat_or_default(chat: Option<ChatProbe>) -> ChatProbe {
    chat.unwrap_or_else(|| ChatProbe {
        model: "default".into(),
        prompt: "pdwarden verification probe".into(),
        max_tokens: 8,
        greedy: false,
    })
}

/// The most tokens read from a stream that asked for `max_tokens` before it
/// is cut as a runaway: twice the ask, and never fewer than 64 over it
/// (an engine may count a piece or two differently; a stream that ignores
/// `max_tokens` is cut long before its timings weigh on a report).
pub fn runaway_limit(max_tokens: u32) -> u64 {
    let asked = u64::from(max_tokens);
    (asked * 2).max(asked + 64)
}

/// How long a streamed request may take in all, and without a token.
#[derive(Clone, Copy)]
pub(crate) struct StreamLimits {
    /// The whole request, first token included: before its first token a
    /// stream may be silent this long (a prefill, and through a router the
    /// prefill's whole answer, comes before it — ROUTER-NOTES.md).
    pub timeout: Duration,
    /// The longest gap between two tokens, counted from the first token on.
    pub silence: Duration,
}

/// Streams one chat completion with `messages`, timing every content chunk.
/// Ends at `[DONE]`, at the first error event, at `timeout`, or once
/// `silence` passes without a token after the first one. Records the tokens
/// asked for, the last `finish_reason` and the first error event's message
/// (issue 30): an error event makes the request an Error even if `[DONE]`
/// follows, as does a finish_reason "abort" or "error".
async fn stream_chat(
    http: &reqwest::Client,
    base_url: &str,
    chat: &ChatProbe,
    messages: Value,
    limits: StreamLimits,
    index: u32,
    cut: Option<&CancellationToken>,
) -> (SuiteRequestSample, String) {
    let request_id = format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4());
    let mut sample = SuiteRequestSample {
        index,
        request_id: request_id.clone(),
        outcome: ProbeOutcome::Error as i32,
        tokens_asked: chat.max_tokens,
        ..Default::default()
    };
    let timeout = limits.timeout;
    let body = json!({
        "model": chat.model,
        "messages": messages,
        "max_tokens": chat.max_tokens,
        "stream": true,
        "temperature": 0,
    });
    let started = Instant::now();
    let deadline = started + timeout;
    let elapsed_ms = || started.elapsed().as_millis() as u64;
    let send = http
        .post(format!("{}/v1/chat/completions", base_url.trim_end_matches('/')))
        .header("X-Request-Id", &request_id)
        .header(PROBE_HEADER, "1")
        .json(&body)
        .send();
    let sent = async {
        match cut {
            Some(cut) => tokio::select! {
                r = tokio::time::timeout_at(deadline, send) => Some(r),
                () = cut.cancelled() => None,
            },
            None => Some(tokio::time::timeout_at(deadline, send).await),
        }
    };
    let resp = match sent.await {
        None => {
            sample.outcome = ProbeOutcome::Timeout as i32;
            sample.latency_ms = elapsed_ms();
            sample.error = format!("{CUT} before any answer, after {} ms", sample.latency_ms);
            return (sample, String::new());
        }
        Some(Err(_)) => {
            sample.outcome = ProbeOutcome::Timeout as i32;
            sample.latency_ms = elapsed_ms();
            sample.error = format!("no response within {} ms", timeout.as_millis());
            return (sample, String::new());
        }
        Some(Ok(Err(e))) => {
            sample.latency_ms = elapsed_ms();
            sample.error = error_chain(&e);
            return (sample, String::new());
        }
        Some(Ok(Ok(r))) => r,
    };
    sample.http_status = i32::from(resp.status().as_u16());
    if !resp.status().is_success() {
        sample.latency_ms = elapsed_ms();
        let text = crate::checks::read_body_limited(resp, 64 << 10)
            .await
            .unwrap_or_else(|e| e.to_string());
        sample.error = format!(
            "http {}: {}",
            sample.http_status,
            text.chars().take(200).collect::<String>()
        );
        return (sample, String::new());
    }
    let mut content = String::new();
    let read = read_stream(resp, started, limits, chat.max_tokens, cut, |now, piece| {
        sample
            .token_times_ms
            .push(duration_ms(now.saturating_duration_since(started)));
        content.push_str(piece);
    })
    .await;
    if read.timed_out {
        sample.outcome = ProbeOutcome::Timeout as i32;
    }
    sample.error = read.error;
    sample.finish_reason = read.finish_reason;
    sample.stream_error = read.stream_error.unwrap_or_default();
    let done = read.done;
    sample.latency_ms = elapsed_ms();
    sample.tokens = sample.token_times_ms.len() as u32;
    sample.ttft_ms = sample.token_times_ms.first().copied().unwrap_or(0);
    if !sample.stream_error.is_empty() {
        sample.outcome = ProbeOutcome::Error as i32;
        sample.error = format!(
            "error event in the stream after {} tokens: {}",
            sample.tokens, sample.stream_error
        );
    } else if done && is_failed_finish(&sample.finish_reason) {
        sample.error = format!(
            "finish_reason \"{}\" after {} of {} tokens",
            sample.finish_reason, sample.tokens, sample.tokens_asked
        );
    } else if done && sample.tokens > 0 {
        sample.outcome = ProbeOutcome::Ok as i32;
        sample.error.clear();
    } else if done {
        sample.error = "stream finished without a token".into();
    }
    (sample, content)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How a streamed answer ended, as [`read_stream`] read it.
pub(crate) struct StreamRead {
    /// `[DONE]` arrived, or the first error event (SGLang sends only
    /// `[DONE]` after it).
    pub done: bool,
    /// The last `finish_reason` the answer carried ("" when none).
    pub finish_reason: String,
    /// The first error event's message.
    pub stream_error: Option<String>,
    /// Why the read stopped short, in words ("" when it did not).
    pub error: String,
    /// It stopped at the deadline or the silence limit.
    pub timed_out: bool,
}

/// The one reader of a streamed chat completion (the suite's requests and
/// the gate's benchmark; issue 33: there were two): reads SSE events until
/// `[DONE]`, the first error event, `limits.timeout` after `started`, a
/// gap of `limits.silence` between tokens (not before the first), an event
/// over [`MAX_SSE_EVENT_BYTES`], or a runaway past `max_tokens`
/// ([`runaway_limit`]: cut, a finding rather than a bigger report).
/// `on_token` sees each content piece with its arrival time.
pub(crate) async fn read_stream(
    resp: reqwest::Response,
    started: Instant,
    limits: StreamLimits,
    max_tokens: u32,
    cut: Option<&CancellationToken>,
    mut on_token: impl FnMut(Instant, &str),
) -> StreamRead {
    let StreamLimits { timeout, silence } = limits;
    let deadline = started + timeout;
    let elapsed_ms = || duration_ms(started.elapsed());
    let mut read = StreamRead {
        done: false,
        finish_reason: String::new(),
        stream_error: None,
        error: String::new(),
        timed_out: false,
    };
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut tokens: u64 = 0;
    // When the last token arrived, and ms after `started`; none yet: the
    // silence limit does not apply before the first token, only the whole
    // request's.
    let mut last_token: Option<(Instant, u64)> = None;
    'read: while !read.done {
        let wait_until = last_token.map_or(deadline, |(t, _)| (t + silence).min(deadline));
        let next = async {
            match cut {
                Some(cut) => tokio::select! {
                    r = tokio::time::timeout_at(wait_until, stream.next()) => Some(r),
                    () = cut.cancelled() => None,
                },
                None => Some(tokio::time::timeout_at(wait_until, stream.next()).await),
            }
        };
        match next.await {
            None => {
                read.timed_out = true;
                let last = last_token.map_or(0, |(_, ms)| ms);
                read.error = format!(
                    "{CUT}: stream silent for {} ms after token {tokens}",
                    elapsed_ms().saturating_sub(last)
                );
                break;
            }
            Some(Err(_)) => {
                read.timed_out = true;
                read.error = if Instant::now() >= deadline {
                    format!(
                        "stream not finished within {} ms{}",
                        timeout.as_millis(),
                        if last_token.is_none() {
                            " (no token arrived)"
                        } else {
                            ""
                        }
                    )
                } else {
                    let last = last_token.map_or(0, |(_, ms)| ms);
                    format!(
                        "stream silent for {} ms after token {tokens}",
                        elapsed_ms().saturating_sub(last)
                    )
                };
                break;
            }
            Some(Ok(None)) => {
                read.error = "stream ended without [DONE]".into();
                break;
            }
            Some(Ok(Some(Err(e)))) => {
                read.error = error_chain(&e);
                break;
            }
            Some(Ok(Some(Ok(bytes)))) => {
                let now = Instant::now();
                buf.push_str(&String::from_utf8_lossy(&bytes));
                if buf.len() > MAX_SSE_EVENT_BYTES {
                    read.error = format!("an SSE event exceeded {MAX_SSE_EVENT_BYTES} bytes; stream abandoned");
                    break;
                }
                for event in drain_sse_events(&mut buf) {
                    match event {
                        SseEvent::Done => {
                            read.done = true;
                            break;
                        }
                        SseEvent::Content(piece) => {
                            tokens += 1;
                            last_token = Some((now, duration_ms(now.saturating_duration_since(started))));
                            on_token(now, &piece);
                            if tokens > runaway_limit(max_tokens) {
                                // Too many tokens is a finding, not a bigger
                                // report (issue 32: a stream past max_tokens
                                // grew a report to 8 MB and broke history).
                                read.error = format!(
                                    "a runaway stream: more than {} tokens for max_tokens {max_tokens}; cut (the engine or router ignores max_tokens)",
                                    runaway_limit(max_tokens)
                                );
                                break 'read;
                            }
                        }
                        SseEvent::Finish(reason) => read.finish_reason = reason,
                        SseEvent::Error(message) => {
                            // The first error ends the read: SGLang sends
                            // only [DONE] after it.
                            read.stream_error = Some(message);
                            read.done = true;
                            break;
                        }
                    }
                }
            }
        }
    }
    read
}

async fn long_generation(
    http: &reqwest::Client,
    base_url: &str,
    s: &SuiteLongGeneration,
    cut: &CancellationToken,
) -> SuiteRequestSample {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let silence = Duration::from_millis(if s.silence_timeout_ms == 0 {
        s.timeout_ms
    } else {
        s.silence_timeout_ms
    });
    let messages = json!([{ "role": "user", "content": chat.prompt }]);
    stream_chat(
        http,
        base_url,
        &chat,
        messages,
        StreamLimits { timeout, silence },
        0,
        Some(cut),
    )
    .await
    .0
}

async fn multi_turn(
    http: &reqwest::Client,
    base_url: &str,
    s: &SuiteMultiTurn,
    cut: &CancellationToken,
) -> Vec<SuiteRequestSample> {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let first_messages = json!([{ "role": "user", "content": chat.prompt }]);
    let limits = StreamLimits {
        timeout,
        silence: timeout,
    };
    let (first, answer) = stream_chat(http, base_url, &chat, first_messages, limits, 0, Some(cut)).await;
    if first.outcome != ProbeOutcome::Ok as i32 {
        return vec![first, error_sample(1, "turn 2 not sent: turn 1 failed".into())];
    }
    // Turn 2 extends turn 1's conversation: the same prefix, then more.
    let second_messages = json!([
        { "role": "user", "content": chat.prompt },
        { "role": "assistant", "content": answer },
        { "role": "user", "content": s.second_prompt },
    ]);
    let (second, _) = stream_chat(http, base_url, &chat, second_messages, limits, 1, Some(cut)).await;
    vec![first, second]
}

fn probe_sample(index: u32, r: crate::checks::ChatOutcome) -> SuiteRequestSample {
    SuiteRequestSample {
        index,
        outcome: r.outcome as i32,
        latency_ms: r.latency.as_millis() as u64,
        tokens: r.tokens,
        error: r.error,
        http_status: i32::from(r.http_status),
        request_id: r.request_id,
        tokens_asked: r.tokens_asked,
        finish_reason: r.finish_reason,
        ..Default::default()
    }
}

async fn concurrency(
    http: &reqwest::Client,
    base_url: &str,
    s: &SuiteConcurrency,
    cut: &CancellationToken,
) -> Vec<SuiteRequestSample> {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let started = Instant::now();
    let all = (0..s.requests.max(1)).map(|i| {
        let chat = chat.clone();
        async move {
            tokio::select! {
                r = chat_probe(http, base_url, &chat, timeout) => probe_sample(i, r),
                () = cut.cancelled() => {
                    let latency_ms = duration_ms(started.elapsed());
                    SuiteRequestSample {
                        index: i,
                        outcome: ProbeOutcome::Timeout as i32,
                        latency_ms,
                        error: format!("{CUT} after {latency_ms} ms unanswered"),
                        tokens_asked: chat.max_tokens,
                        ..Default::default()
                    }
                }
            }
        }
    });
    futures::future::join_all(all).await
}

async fn abort_storm(http: &reqwest::Client, base_url: &str, s: &SuiteAbortStorm) -> Vec<SuiteRequestSample> {
    let chat = chat_or_default(s.chat.clone());
    let abort_after = Duration::from_millis(s.abort_after_ms.max(1));
    let long_prompt = format!("{} {}", chat.prompt, "context ".repeat(s.prompt_tokens as usize));
    let abandoned = (0..s.requests).map(|i| {
        let long = ChatProbe {
            prompt: long_prompt.clone(),
            ..chat.clone()
        };
        async move {
            // The client gives up after abort_after: the request is dropped,
            // its connection closed, mid-prefill.
            let mut sample = probe_sample(i, chat_probe(http, base_url, &long, abort_after).await);
            sample.aborted = sample.outcome == ProbeOutcome::Timeout as i32;
            sample
        }
    });
    let mut samples = futures::future::join_all(abandoned).await;
    let timeout = Duration::from_millis(s.probe_timeout_ms.max(1));
    samples.push(probe_sample(
        s.requests,
        chat_probe(http, base_url, &chat, timeout).await,
    ));
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    // Property: complete events are parsed and removed; a partial event stays
    // in the buffer for the next chunk; nothing after [DONE] is read.
    #[test]
    fn sse_events_are_drained_in_order() {
        let mut buf = String::from(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
             data: {\"choices\":[{\"delta\":{\"content\":\"The \"}}]}\n\n\
             : keep-alive comment\n\n\
             data: not json\n\n\
             data: {\"choices\":[{\"delta\":{\"content\":\"quick\"}}]}\n\ndata: {\"cho",
        );
        assert_eq!(
            drain_sse_events(&mut buf),
            vec![SseEvent::Content("The ".into()), SseEvent::Content("quick".into())]
        );
        assert_eq!(buf, "data: {\"cho");
        buf.push_str("ices\":[]}\n\ndata: [DONE]\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"late\"}}]}\n\n");
        assert_eq!(drain_sse_events(&mut buf), vec![SseEvent::Done]);
    }

    // Property (issue 30): an error event is read whatever shape it comes in
    // (SGLang's `{"error": {…}}`, vLLM's ErrorResponse), and [DONE] after it
    // still ends the stream; a finish reason is read as a string or as an
    // object's `type`, after the same chunk's content; null is none.
    #[test]
    fn error_events_and_finish_reasons_are_drained() {
        let mut buf = String::from(
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
             data: {\"error\": {\"message\": \"Abort in decode\", \"type\": \"BadRequestError\", \"code\": 400}}\n\n\
             data: {\"object\":\"error\",\"message\":\"engine dead\",\"type\":\"x\",\"code\":500}\n\n\
             data: [DONE]\n\n",
        );
        assert_eq!(
            drain_sse_events(&mut buf),
            vec![
                SseEvent::Content("a".into()),
                SseEvent::Error("Abort in decode".into()),
                SseEvent::Error("engine dead".into()),
                SseEvent::Done
            ]
        );
        let mut buf = String::from(
            "data: {\"choices\":[{\"delta\":{\"content\":\"z\"},\"finish_reason\":\"length\"}]}\n\n\
             data: {\"choices\":[{\"delta\":{},\"finish_reason\":{\"type\":\"abort\",\"message\":\"m\"}}]}\n\n\
             event: error\ndata: {\"error\":\n\
             data: \"split over two data lines\"}\n\n",
        );
        assert_eq!(
            drain_sse_events(&mut buf),
            vec![
                SseEvent::Content("z".into()),
                SseEvent::Finish("length".into()),
                SseEvent::Finish("abort".into()),
                SseEvent::Error("split over two data lines".into())
            ]
        );
        assert!(buf.is_empty());
    }

    /// A router stand-in on 127.0.0.1:0 answering every chat completion
    /// with `script`: each chunk sent after its delay (ms), then the end.
    async fn streaming(script: Vec<(u64, &'static str)>) -> String {
        let script = std::sync::Arc::new(script);
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let script = script.clone();
                async move {
                    let chunks = futures::stream::iter(script.iter().copied().collect::<Vec<_>>()).then(
                        |(ms, chunk)| async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            Ok::<_, std::convert::Infallible>(chunk)
                        },
                    );
                    (
                        [("content-type", "text/event-stream")],
                        axum::body::Body::from_stream(chunks),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"t\"},\"finish_reason\":null}]}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn limits(timeout_ms: u64, silence_ms: u64) -> StreamLimits {
        StreamLimits {
            timeout: Duration::from_millis(timeout_ms),
            silence: Duration::from_millis(silence_ms),
        }
    }

    async fn run(url: &str, max_tokens: u32, l: StreamLimits) -> SuiteRequestSample {
        let chat = ChatProbe {
            max_tokens,
            ..chat_or_default(None)
        };
        let messages = json!([{ "role": "user", "content": "hi" }]);
        stream_chat(&crate::checks::http_client(), url, &chat, messages, l, 0, None)
            .await
            .0
    }

    /// Issue 47: a cut ends a stream that paused mid-way at once (not at
    /// its silence limit or its timeout), as a timeout with the tokens it
    /// got, saying it was cut.
    #[tokio::test]
    async fn a_cut_ends_a_paused_stream_with_what_it_got() {
        let url = streaming(vec![(0, TOKEN), (0, TOKEN), (0, TOKEN), (60_000, TOKEN), (0, DONE)]).await;
        let cut = CancellationToken::new();
        let chat = ChatProbe {
            max_tokens: 8,
            ..chat_or_default(None)
        };
        let messages = json!([{ "role": "user", "content": "hi" }]);
        let started = Instant::now();
        let http = crate::checks::http_client();
        let ((s, _), ()) = tokio::join!(
            stream_chat(&http, &url, &chat, messages, limits(120_000, 120_000), 0, Some(&cut)),
            async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                cut.cancel();
            }
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert_eq!(s.outcome, ProbeOutcome::Timeout as i32, "{s:?}");
        assert_eq!(s.tokens, 3);
        assert!(s.error.starts_with(CUT), "{}", s.error);
        assert!(s.error.contains("after token 3"), "{}", s.error);
    }

    /// Property (issue 30): an error event inside a 200 stream makes the
    /// request an Error naming it and the tokens before it, even though
    /// [DONE] follows; the tokens asked and the message are reported.
    #[tokio::test]
    async fn an_error_event_then_done_is_an_error() {
        let url = streaming(vec![
            (0, TOKEN),
            (0, TOKEN),
            (
                0,
                "data: {\"error\": {\"message\": \"Abort: KV transfer failed\", \"type\": \"InternalServerError\", \"code\": 500}}\n\n",
            ),
            (0, DONE),
        ])
        .await;
        let s = run(&url, 8, limits(10_000, 5_000)).await;
        assert_eq!(s.outcome, ProbeOutcome::Error as i32, "{s:?}");
        assert_eq!(s.http_status, 200);
        assert_eq!((s.tokens, s.tokens_asked), (2, 8));
        assert_eq!(s.stream_error, "Abort: KV transfer failed");
        assert_eq!(
            s.error,
            "error event in the stream after 2 tokens: Abort: KV transfer failed"
        );
    }

    /// Property (issue 30): the last finish_reason is reported, as a string
    /// or an object's `type`; "length" is OK, "abort" is an Error naming it.
    #[tokio::test]
    async fn the_finish_reason_is_reported_string_or_object() {
        let url = streaming(vec![
            (0, TOKEN),
            (
                0,
                "data: {\"choices\":[{\"delta\":{\"content\":\"u\"},\"finish_reason\":\"length\"}]}\n\n",
            ),
            (0, DONE),
        ])
        .await;
        let s = run(&url, 2, limits(10_000, 5_000)).await;
        assert_eq!(s.outcome, ProbeOutcome::Ok as i32, "{s:?}");
        assert_eq!((s.tokens, s.tokens_asked, s.finish_reason.as_str()), (2, 2, "length"));
        assert_eq!(s.stream_error, "");

        let url = streaming(vec![
            (0, TOKEN),
            (
                0,
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":{\"type\":\"abort\",\"message\":\"x\"}}]}\n\n",
            ),
            (0, DONE),
        ])
        .await;
        let s = run(&url, 8, limits(10_000, 5_000)).await;
        assert_eq!(s.outcome, ProbeOutcome::Error as i32, "{s:?}");
        assert_eq!((s.tokens, s.tokens_asked, s.finish_reason.as_str()), (1, 8, "abort"));
        assert_eq!(s.error, "finish_reason \"abort\" after 1 of 8 tokens");
    }

    /// Issue 32: a stream that ignores max_tokens is cut at the runaway
    /// limit and is an Error saying so — its timings stay bounded (before:
    /// every token of ~1.5 M went into the report, 8 MB, and `history`
    /// broke for everyone).
    #[tokio::test]
    async fn a_runaway_stream_is_cut_and_an_error() {
        let url = streaming(vec![(0, TOKEN); 500]).await;
        let s = run(&url, 8, limits(10_000, 5_000)).await;
        assert_eq!(s.outcome, ProbeOutcome::Error as i32, "{s:?}");
        assert_eq!(u64::from(s.tokens), runaway_limit(8) + 1, "{s:?}");
        assert!(
            s.error
                .starts_with("a runaway stream: more than 72 tokens for max_tokens 8; cut"),
            "{}",
            s.error
        );
    }

    /// Property: the silence limit is the gap between tokens. A first token
    /// later than it (a long prefill, or the prefill's whole answer through
    /// a router) followed by a normal stream is OK; a gap longer than it
    /// after the first token is a silent stream; before the first token
    /// only the whole request's timeout applies.
    #[tokio::test]
    async fn a_late_first_token_is_not_silence() {
        let url = streaming(vec![(600, TOKEN), (10, TOKEN), (10, TOKEN), (10, DONE)]).await;
        let s = run(&url, 3, limits(10_000, 200)).await;
        assert_eq!(s.outcome, ProbeOutcome::Ok as i32, "{s:?}");
        assert_eq!(s.tokens, 3);
        assert!(s.ttft_ms >= 600, "{s:?}");

        let url = streaming(vec![(0, TOKEN), (800, TOKEN), (0, DONE)]).await;
        let s = run(&url, 3, limits(10_000, 200)).await;
        assert_eq!(s.outcome, ProbeOutcome::Timeout as i32, "{s:?}");
        assert!(s.error.starts_with("stream silent for "), "{}", s.error);
        assert!(s.error.ends_with("after token 1"), "{}", s.error);

        let url = streaming(vec![(5_000, TOKEN), (0, DONE)]).await;
        let s = run(&url, 3, limits(700, 200)).await;
        assert_eq!(s.outcome, ProbeOutcome::Timeout as i32, "{s:?}");
        assert_eq!(s.error, "stream not finished within 700 ms (no token arrived)");
        assert!(s.latency_ms >= 700, "{s:?}");
    }
}
