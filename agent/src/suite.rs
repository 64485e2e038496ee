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

use crate::checks::{PROBE_HEADER, REQUEST_ID_PREFIX, chat_probe, error_chain};

/// The longest SSE event accepted: a token chunk is a few hundred bytes; a
/// stream that never sends an event separator must not grow memory forever.
pub(crate) const MAX_SSE_EVENT_BYTES: usize = 1 << 20;

/// What a chat-completion SSE stream said, event by event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// A chunk carrying generated text (one token, for SGLang-like engines).
    Content(String),
    /// `data: [DONE]`.
    Done,
}

/// Removes every complete event (`…\n\n`) from the front of `buf` and returns
/// the ones that matter; events without content (role, usage, finish chunks,
/// comments, garbage) are skipped. Pure, so it is fuzzed directly: whatever a
/// broken engine sends, this never panics.
pub fn drain_sse_events(buf: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let event: String = buf.drain(..end + 2).collect();
        let Some(data) = event.trim().strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            out.push(SseEvent::Done);
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(piece) = v.pointer("/choices/0/delta/content").and_then(Value::as_str)
            && !piece.is_empty()
        {
            out.push(SseEvent::Content(piece.to_string()));
        }
    }
    out
}

/// Runs one suite step against `base_url` (the router) and returns its samples.
pub async fn run_step(
    http: &reqwest::Client,
    base_url: &str,
    command_id: &str,
    req: SuiteStepRequest,
) -> SuiteStepResult {
    let (step, samples) = match req.step {
        Some(Step::LongGeneration(s)) => ("long_generation", vec![long_generation(http, base_url, &s).await]),
        Some(Step::MultiTurn(s)) => ("multi_turn", multi_turn(http, base_url, &s).await),
        Some(Step::Concurrency(s)) => ("concurrency", concurrency(http, base_url, &s).await),
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
    })
}

/// Streams one chat completion with `messages`, timing every content chunk.
/// Ends at `[DONE]`, at `timeout`, or after `silence` without a chunk.
/// How long a streamed request may take in all, and without a token.
#[derive(Clone, Copy)]
struct StreamLimits {
    timeout: Duration,
    silence: Duration,
}

async fn stream_chat(
    http: &reqwest::Client,
    base_url: &str,
    chat: &ChatProbe,
    messages: Value,
    limits: StreamLimits,
    index: u32,
) -> (SuiteRequestSample, String) {
    let request_id = format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4());
    let mut sample = SuiteRequestSample {
        index,
        request_id: request_id.clone(),
        outcome: ProbeOutcome::Error as i32,
        ..Default::default()
    };
    let StreamLimits { timeout, silence } = limits;
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
    let resp = match tokio::time::timeout_at(deadline, send).await {
        Err(_) => {
            sample.outcome = ProbeOutcome::Timeout as i32;
            sample.latency_ms = elapsed_ms();
            sample.error = format!("no response within {} ms", timeout.as_millis());
            return (sample, String::new());
        }
        Ok(Err(e)) => {
            sample.latency_ms = elapsed_ms();
            sample.error = error_chain(&e);
            return (sample, String::new());
        }
        Ok(Ok(r)) => r,
    };
    sample.http_status = i32::from(resp.status().as_u16());
    if !resp.status().is_success() {
        sample.latency_ms = elapsed_ms();
        let text = crate::checks::read_body_limited(resp, 64 << 10)
            .await
            .unwrap_or_else(|e| e);
        sample.error = format!(
            "http {}: {}",
            sample.http_status,
            text.chars().take(200).collect::<String>()
        );
        return (sample, String::new());
    }
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut content = String::new();
    let mut done = false;
    while !done {
        let wait_until = (Instant::now() + silence).min(deadline);
        match tokio::time::timeout_at(wait_until, stream.next()).await {
            Err(_) => {
                sample.outcome = ProbeOutcome::Timeout as i32;
                let last = sample.token_times_ms.last().copied().unwrap_or(0);
                sample.error = if Instant::now() >= deadline {
                    format!("stream not finished within {} ms", timeout.as_millis())
                } else {
                    format!(
                        "stream silent for {} ms after token {}",
                        elapsed_ms().saturating_sub(last),
                        sample.token_times_ms.len()
                    )
                };
                break;
            }
            Ok(None) => {
                sample.error = "stream ended without [DONE]".into();
                break;
            }
            Ok(Some(Err(e))) => {
                sample.error = error_chain(&e);
                break;
            }
            Ok(Some(Ok(bytes))) => {
                let at = elapsed_ms();
                buf.push_str(&String::from_utf8_lossy(&bytes));
                if buf.len() > MAX_SSE_EVENT_BYTES {
                    sample.error = format!("an SSE event exceeded {MAX_SSE_EVENT_BYTES} bytes; stream abandoned");
                    break;
                }
                for event in drain_sse_events(&mut buf) {
                    match event {
                        SseEvent::Done => {
                            done = true;
                            break;
                        }
                        SseEvent::Content(piece) => {
                            sample.token_times_ms.push(at);
                            content.push_str(&piece);
                        }
                    }
                }
            }
        }
    }
    sample.latency_ms = elapsed_ms();
    sample.tokens = sample.token_times_ms.len() as u32;
    sample.ttft_ms = sample.token_times_ms.first().copied().unwrap_or(0);
    if done && sample.tokens > 0 {
        sample.outcome = ProbeOutcome::Ok as i32;
        sample.error.clear();
    } else if done {
        sample.error = "stream finished without a token".into();
    }
    (sample, content)
}

async fn long_generation(http: &reqwest::Client, base_url: &str, s: &SuiteLongGeneration) -> SuiteRequestSample {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let silence = Duration::from_millis(if s.silence_timeout_ms == 0 {
        s.timeout_ms
    } else {
        s.silence_timeout_ms
    });
    let messages = json!([{ "role": "user", "content": chat.prompt }]);
    stream_chat(http, base_url, &chat, messages, StreamLimits { timeout, silence }, 0)
        .await
        .0
}

async fn multi_turn(http: &reqwest::Client, base_url: &str, s: &SuiteMultiTurn) -> Vec<SuiteRequestSample> {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let first_messages = json!([{ "role": "user", "content": chat.prompt }]);
    let limits = StreamLimits {
        timeout,
        silence: timeout,
    };
    let (first, answer) = stream_chat(http, base_url, &chat, first_messages, limits, 0).await;
    if first.outcome != ProbeOutcome::Ok as i32 {
        return vec![first, error_sample(1, "turn 2 not sent: turn 1 failed".into())];
    }
    // Turn 2 extends turn 1's conversation: the same prefix, then more.
    let second_messages = json!([
        { "role": "user", "content": chat.prompt },
        { "role": "assistant", "content": answer },
        { "role": "user", "content": s.second_prompt },
    ]);
    let (second, _) = stream_chat(http, base_url, &chat, second_messages, limits, 1).await;
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
        ..Default::default()
    }
}

async fn concurrency(http: &reqwest::Client, base_url: &str, s: &SuiteConcurrency) -> Vec<SuiteRequestSample> {
    let chat = chat_or_default(s.chat.clone());
    let timeout = Duration::from_millis(s.timeout_ms.max(1));
    let all = (0..s.requests.max(1)).map(|i| {
        let chat = chat.clone();
        async move { probe_sample(i, chat_probe(http, base_url, &chat, timeout).await) }
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
}
