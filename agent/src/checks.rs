//! HTTP evidence gathering: health polls, generation checks and probe-tagged
//! chat completions, each turned into a plain observation value.
//!
//! This is the only place the agent talks HTTP to its units. Requests go over
//! a fresh connection each time (no pooling), so a poll never rides a
//! keep-alive connection to a process that has since been replaced, and
//! system proxies are ignored (units are on loopback). Every probe carries
//! `X-Request-Id: pdwarden-probe-<uuid>` and `X-Pdwarden-Probe: 1`: only the
//! request id survives sglang-router (ROUTER-NOTES.md), so engines behind a
//! router can still tell probes from traffic.

use std::time::Duration;

use pdwarden_proto::limits::{
    MAX_ANSWER_ENCODED_BYTES, MAX_ANSWER_TOKEN_BYTES, MAX_TOKEN_ALTERNATIVES, answer_entry_len,
};
use pdwarden_proto::v1::{AnswerToken, ChatProbe, ProbeOutcome, TokenAlternative};
use serde_json::json;
use tokio::time::Instant;

use crate::readiness::{Checker, GenerationObservation, HealthObservation};

/// Header carrying the probe's request id; the prefix marks it as a probe.
pub const REQUEST_ID_HEADER: &str = "X-Request-Id";
pub const REQUEST_ID_PREFIX: &str = "pdwarden-probe-";
/// Extra tag for probes sent straight to an engine (dropped by the router).
pub const PROBE_HEADER: &str = "X-Pdwarden-Probe";

/// The agent's HTTP client for health polls and probes.
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client with static settings")
}

/// The most of a probe's answer the agent reads: far more than any real
/// answer to a probe, far less than a broken engine could send.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// The most of a health or generation-check answer the agent reads.
pub const MAX_HEALTH_BYTES: usize = 64 << 10;

/// Why a response body could not be read ([`read_body_limited`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// The body broke off: the HTTP client's error, with its causes.
    #[error("reading response: {0}")]
    Read(String),
    /// The body is larger than the limit; it was not read further.
    #[error("response larger than {limit} bytes; not read further")]
    TooLarge { limit: usize },
}

/// Reads a response body of at most `limit` bytes, as text (invalid UTF-8 is
/// replaced, never a panic). A larger body is an error and is not read
/// further, so an oversized or endless answer costs bounded memory.
pub async fn read_body_limited(mut resp: reqwest::Response, limit: usize) -> Result<String, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| BodyError::Read(error_chain(&e)))? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The outcome of one probe-tagged chat completion.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatOutcome {
    pub outcome: ProbeOutcome,
    pub latency: Duration,
    pub tokens: u32,
    /// Empty when `outcome` is OK.
    pub error: String,
    /// 0 when no HTTP answer arrived.
    pub http_status: u16,
    pub request_id: String,
    /// The request's `max_tokens` (issue 30).
    pub tokens_asked: u32,
    /// The answer's `choices[0].finish_reason` ("stop", "length", "abort",
    /// …; an object's `type`, as SGLang sends `{"type": "abort", …}`); ""
    /// when none arrived. Reported whatever the outcome.
    pub finish_reason: String,
    /// Issue 34, a greedy probe's only (its body asked for `logprobs`):
    /// the answer's tokens with their logprobs ([`answer_of`]), whatever the
    /// outcome once a 200 answer that is not an error body was read; empty
    /// otherwise, and after a timeout.
    pub answer: Vec<AnswerToken>,
    /// A greedy probe's answer (as for `answer`) had no
    /// `choices[0].logprobs.content`: the engine or router returns no
    /// logprobs. Nothing else follows from it here.
    pub answer_logprobs_missing: bool,
    /// The answer's `kv_transfer_params` (a vLLM prefill asked with
    /// `do_remote_decode`: what its decode needs to pull the KV), if any.
    pub kv_transfer_params: Option<serde_json::Value>,
}

/// POSTs one probe-tagged, non-streaming, temperature-0 chat completion to
/// `base_url/v1/chat/completions`. OK requires at least one completion token
/// within `timeout` (body included), and an answer that is not an error in
/// a 200's clothing (see [`post_generation`]).
pub async fn chat_probe(client: &reqwest::Client, base_url: &str, chat: &ChatProbe, timeout: Duration) -> ChatOutcome {
    let body = chat_body(chat);
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    post_generation(client, &url, &body, timeout).await
}

/// One probe over a prefill → decode KV path (`ProbeRequest.pd_path`), as
/// sglang-router sends a request (ROUTER-NOTES.md): the chat body with
/// `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room` goes to
/// the prefill and to the decode at once, both probe-tagged; the decode's
/// answer is the outcome (it holds only once the KV came over), the
/// prefill's is awaited within the same timeout but decides nothing.
///
/// A prefill with no bootstrap port (`path.bootstrap_port` 0: a vLLM
/// engine) is met as vLLM's PD proxy meets it
/// (`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`): the
/// prefill first, asked for one token with `kv_transfer_params`
/// `do_remote_decode`, then the decode with the `kv_transfer_params` the
/// prefill answered (its engine id, blocks, host and port), so the decode
/// pulls that KV over the path.
pub async fn pd_path_probe(
    client: &reqwest::Client,
    prefill_url: &str,
    path: &pdwarden_proto::v1::PdPath,
    chat: &ChatProbe,
    timeout: Duration,
) -> ChatOutcome {
    pd_path_probe_sided(client, prefill_url, path, chat, timeout).await.0
}

/// The start of an error whose request never connected (refused, no
/// route): its engine did not accept the connection at all.
pub const COULD_NOT_CONNECT: &str = "could not connect";

/// [`pd_path_probe`], and which side of the path did not accept the
/// probe's connection while the other did (issue 46: evidence that names
/// one engine of a failing path): "prefill", "decode" or "".
pub async fn pd_path_probe_sided(
    client: &reqwest::Client,
    prefill_url: &str,
    path: &pdwarden_proto::v1::PdPath,
    chat: &ChatProbe,
    timeout: Duration,
) -> (ChatOutcome, &'static str) {
    let refused = |o: &ChatOutcome| o.outcome != ProbeOutcome::Ok && o.error.starts_with(COULD_NOT_CONNECT);
    if path.bootstrap_port == 0 {
        let (outcome, prefill_refused) = vllm_path_probe(client, prefill_url, path, chat, timeout).await;
        // vLLM's order: the decode is asked only once the prefill answered.
        let side = if prefill_refused {
            "prefill"
        } else if refused(&outcome) {
            "decode"
        } else {
            ""
        };
        return (outcome, side);
    }
    let mut body = chat_body(chat);
    body["bootstrap_host"] = path.bootstrap_host.clone().into();
    body["bootstrap_port"] = path.bootstrap_port.into();
    body["bootstrap_room"] = rand_room().into();
    let prefill = format!("{}/v1/chat/completions", prefill_url.trim_end_matches('/'));
    let decode = format!("{}/v1/chat/completions", path.decode_url.trim_end_matches('/'));
    let (p, mut outcome) = tokio::join!(
        post_generation(client, &prefill, &body, timeout),
        post_generation(client, &decode, &body, timeout)
    );
    let side = match (refused(&p), refused(&outcome)) {
        (true, false) => {
            if outcome.outcome == ProbeOutcome::Ok {
                ""
            } else {
                outcome.error = format!("prefill {prefill_url}: {}; decode: {}", p.error, outcome.error);
                "prefill"
            }
        }
        (false, true) => {
            outcome.error = format!("decode {}: {}", path.decode_url, outcome.error);
            "decode"
        }
        _ => "",
    };
    (outcome, side)
}

/// [`pd_path_probe`] on vLLM's protocol: prefill, then decode with what it
/// answered, both within `timeout` together.
async fn vllm_path_probe(
    client: &reqwest::Client,
    prefill_url: &str,
    path: &pdwarden_proto::v1::PdPath,
    chat: &ChatProbe,
    timeout: Duration,
) -> (ChatOutcome, bool) {
    let started = Instant::now();
    let body = chat_body(chat);
    let mut first = body.clone();
    first["max_tokens"] = 1.into();
    first["kv_transfer_params"] = json!({
        "do_remote_decode": true,
        "do_remote_prefill": false,
        "remote_engine_id": null,
        "remote_block_ids": null,
        "remote_host": null,
        "remote_port": null,
    });
    let prefill = format!("{}/v1/chat/completions", prefill_url.trim_end_matches('/'));
    let mut p = post_generation(client, &prefill, &first, timeout).await;
    if p.outcome != ProbeOutcome::Ok {
        let refused = p.error.starts_with(COULD_NOT_CONNECT);
        p.error = format!("prefill {prefill_url}: {}", p.error);
        return (p, refused);
    }
    let mut second = body;
    if let Some(params) = p.kv_transfer_params.take() {
        second["kv_transfer_params"] = params;
    }
    let decode = format!("{}/v1/chat/completions", path.decode_url.trim_end_matches('/'));
    let left = timeout.saturating_sub(started.elapsed());
    let mut d = post_generation(client, &decode, &second, left).await;
    d.latency = started.elapsed();
    (d, false)
}

/// The alternatives a greedy probe asks for at each position: five (the
/// most the orchestrator keeps), so that a token that flipped among
/// several near-tied ones is listed in the reference and its margin read.
const GREEDY_TOP_LOGPROBS: u32 = 5;

/// The probe's chat completion body: one fixed prompt, temperature 0, not
/// streamed. A greedy probe (`chat.greedy`, issue 34) also asks for `seed` 0
/// and the answer's logprobs with [`GREEDY_TOP_LOGPROBS`] alternatives
/// (`logprobs: true` is needed with `top_logprobs` — vLLM refuses the
/// latter alone); [`post_generation`] reads them back because the body asks.
fn chat_body(chat: &ChatProbe) -> serde_json::Value {
    let mut body = json!({
        "model": chat.model,
        "messages": [{"role": "user", "content": chat.prompt}],
        "max_tokens": chat.max_tokens,
        "stream": false,
        "temperature": 0,
    });
    if chat.greedy {
        body["seed"] = 0.into();
        body["logprobs"] = true.into();
        body["top_logprobs"] = GREEDY_TOP_LOGPROBS.into();
    }
    body
}

/// A bootstrap room: SGLang's router draws a random u63.
fn rand_room() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0 >> 1
}

/// The generation check of an engine with no generating GET (vLLM, issue
/// 15): the model it serves (`GET /v1/models`), then one probe-tagged
/// `POST /v1/completions` straight to it with `max_tokens` 1 and
/// `ignore_eos` (a random-weight model may well pick EOS first). OK requires
/// the generated token, all within `timeout`.
pub async fn engine_completion(client: &reqwest::Client, base_url: &str, timeout: Duration) -> ChatOutcome {
    const PROMPT: &str = "pdwarden readiness check: one token.";
    let base = base_url.trim_end_matches('/');
    let started = Instant::now();
    let model = async {
        let resp = client
            .get(format!("{base}/v1/models"))
            .send()
            .await
            .map_err(|e| (0, format!("GET /v1/models failed: {}", error_chain(&e))))?;
        let status = resp.status().as_u16();
        let text = read_body_limited(resp, MAX_HEALTH_BYTES)
            .await
            .map_err(|e| (status, e.to_string()))?;
        if !(200..300).contains(&status) {
            return Err((status, format!("GET /v1/models answered {status}: {}", snippet(&text))));
        }
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| (status, format!("GET /v1/models: not JSON ({e})")))?;
        v.pointer("/data/0/id")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| (status, format!("GET /v1/models names no model: {}", snippet(&text))))
    };
    let model = match tokio::time::timeout(timeout, model).await {
        Ok(Ok(m)) => m,
        Ok(Err((http_status, error))) => {
            return ChatOutcome {
                outcome: ProbeOutcome::Error,
                latency: started.elapsed(),
                tokens: 0,
                error,
                http_status,
                request_id: String::new(),
                tokens_asked: 1,
                finish_reason: String::new(),
                answer: Vec::new(),
                answer_logprobs_missing: false,
                kv_transfer_params: None,
            };
        }
        Err(_) => {
            return ChatOutcome {
                outcome: ProbeOutcome::Timeout,
                latency: started.elapsed(),
                tokens: 0,
                error: format!("GET /v1/models: no answer within {} ms", timeout.as_millis()),
                http_status: 0,
                request_id: String::new(),
                tokens_asked: 1,
                finish_reason: String::new(),
                answer: Vec::new(),
                answer_logprobs_missing: false,
                kv_transfer_params: None,
            };
        }
    };
    let body = json!({
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 1,
        "ignore_eos": true,
        "stream": false,
        "temperature": 0,
    });
    let left = timeout.saturating_sub(started.elapsed());
    let mut r = post_generation(client, &format!("{base}/v1/completions"), &body, left).await;
    r.latency = started.elapsed();
    r
}

/// One probe-tagged generation request: OK requires at least one completion
/// token within `timeout` (body included). A 200 whose body is an error
/// (`{"error": …}`, or vLLM's `{"object": "error", …}`) or whose
/// `finish_reason` is "abort" or "error" (the engine ended the request, not
/// its length or a stop) is an Error naming it (issue 30). The request's
/// `max_tokens`, the answer's `finish_reason` and the tokens it counted are
/// reported whatever the outcome; judging a short answer is the
/// orchestrator's.
///
/// A body that asks for `logprobs` (a greedy probe's, [`chat_body`]) has its
/// answer's tokens read back ([`answer_of`]), or `answer_logprobs_missing`
/// set when the answer has none; either way the outcome is decided as for
/// any probe. The directed prefill → decode probe takes this same path, so
/// it carries the decode's answer.
async fn post_generation(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> ChatOutcome {
    let request_id = format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4());
    let tokens_asked = body
        .get("max_tokens")
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let greedy = body.get("logprobs").and_then(serde_json::Value::as_bool) == Some(true);
    let started = Instant::now();
    let mut http_status = 0u16;
    let mut tokens = 0u32;
    let mut finish_reason = String::new();
    let mut answer = Vec::new();
    let mut answer_logprobs_missing = false;
    let mut kv_transfer_params = None;
    let exchange = async {
        let resp = client
            .post(url)
            .header(REQUEST_ID_HEADER, &request_id)
            .header(PROBE_HEADER, "1")
            .json(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    format!("{COULD_NOT_CONNECT}: {}", error_chain(&e))
                } else {
                    format!("request failed: {}", error_chain(&e))
                }
            })?;
        http_status = resp.status().as_u16();
        let ok = resp.status().is_success();
        let text = read_body_limited(resp, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        if !ok {
            return Err(format!("http {http_status}: {}", snippet(&text)));
        }
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("response is not JSON ({e}): {}", snippet(&text)))?;
        tokens = completion_tokens(&value);
        kv_transfer_params = value.get("kv_transfer_params").filter(|v| !v.is_null()).cloned();
        let finish = value.pointer("/choices/0/finish_reason").and_then(finish_reason_of);
        if let Some((reason, _)) = &finish {
            finish_reason.clone_from(reason);
        }
        if let Some(message) = error_message_of(&value) {
            return Err(format!("http {http_status} carrying an error: {message}"));
        }
        if greedy {
            match answer_of(&value, tokens_asked) {
                Some(a) => answer = a,
                None => answer_logprobs_missing = true,
            }
        }
        if let Some((reason, message)) = &finish
            && is_failed_finish(reason)
        {
            return Err(format!(
                "finish_reason \"{reason}\" after {tokens} of {tokens_asked} tokens{}",
                message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
            ));
        }
        if tokens == 0 {
            return Err(format!("no completion tokens: {}", snippet(&text)));
        }
        Ok(())
    };
    let result = tokio::time::timeout(timeout, exchange).await;
    let latency = started.elapsed();
    let (outcome, error) = match result {
        Ok(Ok(())) => (ProbeOutcome::Ok, String::new()),
        Ok(Err(error)) => (ProbeOutcome::Error, error),
        Err(_) => {
            tokens = 0;
            answer.clear();
            answer_logprobs_missing = false;
            (
                ProbeOutcome::Timeout,
                format!("no answer within {} ms", timeout.as_millis()),
            )
        }
    };
    ChatOutcome {
        outcome,
        latency,
        tokens,
        error,
        http_status,
        request_id,
        tokens_asked,
        finish_reason,
        answer,
        answer_logprobs_missing,
        kv_transfer_params,
    }
}

/// A greedy probe's answer: `choices[0].logprobs.content`, the OpenAI chat
/// shape that both engines send — vLLM's `ChatCompletionLogProbsContent`
/// (`vllm/entrypoints/openai/protocol.py`: `token`, `logprob`, `bytes`,
/// `top_logprobs: [ChatCompletionLogProb]`) and SGLang's
/// `ChatCompletionTokenLogprob` (`python/sglang/srt/entrypoints/openai/protocol.py`:
/// `token`, `bytes`, `logprob`, `top_logprobs: [TopLogprob]`). `None` when
/// the answer has no such list or an empty one: an engine or router that
/// returns no logprobs (both send `"logprobs": null` when not asked).
///
/// The differences read the same here: vLLM's `logprob` defaults to
/// -9999.0 and is floored there (`max(logprob, -9999.0)`, its stand-in for
/// -inf, as OpenAI's), its `bytes` and `top_logprobs` may be missing and
/// `content` null; SGLang requires `bytes`, `top_logprobs` and `content`
/// and passes its logprobs through unfloored. `bytes` is not read (the
/// token is). vLLM may send a token as `token_id:<id>`
/// (`return_tokens_as_token_ids`); it is kept as sent.
///
/// Bounded and panic-free, whatever the engine sends:
/// - at most `max_entries` (the request's `max_tokens`) entries, in order,
///   and no entry past [`MAX_ANSWER_ENCODED_BYTES`] encoded in all;
/// - each token and alternative cut at [`MAX_ANSWER_TOKEN_BYTES`] on a
///   char boundary; at most [`MAX_TOKEN_ALTERNATIVES`] alternatives, in the
///   engine's order;
/// - an entry that is not an object, or a `token` that is not a string,
///   keeps its place with the token "" (the positions stay aligned with the
///   answer's); a `logprob` that is not a number (null, missing) is NaN.
///   JSON has no NaN or infinity: pydantic and orjson write a non-finite
///   float as null, so NaN here means "not finite, or not sent". Logprobs
///   are otherwise kept as f64 exactly as sent, -9999.0 included; a
///   comparison must allow for NaN != NaN.
pub(crate) fn answer_of(v: &serde_json::Value, max_entries: u32) -> Option<Vec<AnswerToken>> {
    use serde_json::Value;
    fn token_of(item: &Value) -> (String, f64) {
        let token = item
            .get("token")
            .and_then(Value::as_str)
            .map_or_else(String::new, cut_token);
        let logprob = item.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN);
        (token, logprob)
    }
    let content = v
        .pointer("/choices/0/logprobs/content")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())?;
    let mut answer = Vec::new();
    let mut encoded = 0usize;
    for item in content.iter().take(usize::try_from(max_entries).unwrap_or(usize::MAX)) {
        let (token, logprob) = token_of(item);
        let top = item
            .get("top_logprobs")
            .and_then(Value::as_array)
            .map(|alts| {
                alts.iter()
                    .take(MAX_TOKEN_ALTERNATIVES)
                    .map(|alt| {
                        let (token, logprob) = token_of(alt);
                        TokenAlternative { token, logprob }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let entry = AnswerToken { token, logprob, top };
        encoded += answer_entry_len(&entry);
        if encoded > MAX_ANSWER_ENCODED_BYTES {
            break;
        }
        answer.push(entry);
    }
    Some(answer)
}

/// `token` cut at [`MAX_ANSWER_TOKEN_BYTES`] on a char boundary.
fn cut_token(token: &str) -> String {
    let mut end = token.len().min(MAX_ANSWER_TOKEN_BYTES);
    while !token.is_char_boundary(end) {
        end -= 1;
    }
    token[..end].to_owned()
}

/// The longest `finish_reason` kept: real ones are a word.
const MAX_FINISH_REASON_CHARS: usize = 64;

/// A `finish_reason` value: a string, or an object with a string `type`
/// (SGLang's `{"type": "abort", "message": …}`), with the object's
/// `message` if any; `None` for null or anything else. Pure, bounded and
/// panic-free (it reads what engines send, in streams too).
pub(crate) fn finish_reason_of(v: &serde_json::Value) -> Option<(String, Option<String>)> {
    let (reason, message) = match v {
        serde_json::Value::String(s) => (s.as_str(), None),
        serde_json::Value::Object(o) => (
            o.get("type").and_then(serde_json::Value::as_str)?,
            o.get("message")
                .and_then(serde_json::Value::as_str)
                .filter(|m| !m.trim().is_empty())
                .map(snippet),
        ),
        _ => return None,
    };
    Some((reason.chars().take(MAX_FINISH_REASON_CHARS).collect(), message))
}

/// A finish reason that says the engine ended the request, not its length
/// or a stop: SGLang's "abort", vLLM's "error".
pub(crate) fn is_failed_finish(reason: &str) -> bool {
    matches!(reason, "abort" | "error")
}

/// The message of an answer that is an error: `{"error": {"message": …}}`
/// (SGLang, vLLM, OpenAI), `{"error": "…"}`, or vLLM's ErrorResponse
/// `{"object": "error", "message": …}`; `None` for anything else. At most
/// [`snippet`]'s length; pure and panic-free.
pub(crate) fn error_message_of(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let text = match v.get("error") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::Object(e)) => match e.get("message").and_then(Value::as_str) {
            Some(m) if !m.trim().is_empty() => m.to_owned(),
            _ => Value::Object(e.clone()).to_string(),
        },
        _ if v.get("object").and_then(Value::as_str) == Some("error") => {
            match v.get("message").and_then(Value::as_str) {
                Some(m) if !m.trim().is_empty() => m.to_owned(),
                _ => v.to_string(),
            }
        }
        _ => return None,
    };
    Some(snippet(&text))
}

/// `usage.completion_tokens`, or 1 if it is missing/zero but
/// `choices[0].message.content` (chat) or `choices[0].text` (completion)
/// is non-empty.
fn completion_tokens(v: &serde_json::Value) -> u32 {
    let usage = v
        .pointer("/usage/completion_tokens")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    if usage > 0 {
        return u32::try_from(usage).unwrap_or(u32::MAX);
    }
    let content = v
        .pointer("/choices/0/message/content")
        .or_else(|| v.pointer("/choices/0/text"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    u32::from(!content.is_empty())
}

fn snippet(text: &str) -> String {
    const MAX: usize = 200;
    let t = text.trim();
    match t.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

/// The error and its causes, joined: reqwest's top-level message alone hides
/// "Connection refused".
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Which generation check a start-up watch runs.
#[derive(Debug, Clone)]
pub enum GenerationCheck {
    /// GET this URL; any 2xx passes (SGLang's `/health_generate`).
    Get { url: String, path: String },
    /// A probe-tagged chat completion that must return ≥1 token (routers).
    Chat { base_url: String, chat: ChatProbe },
    /// A probe-tagged one-token completion sent straight to an engine that
    /// has no generating GET (vLLM).
    Completion { base_url: String },
}

/// The real [`Checker`]: HTTP against one unit.
#[derive(Debug, Clone)]
pub struct HttpChecker {
    pub client: reqwest::Client,
    pub health_url: String,
    pub health_timeout: Duration,
    pub generation: GenerationCheck,
    pub check_timeout: Duration,
    /// Where the engine's version is asked, in order (empty: not asked).
    pub version_urls: Vec<String>,
}

impl HttpChecker {
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        health_path: &str,
        generation: &crate::config::GenerationCheckSpec,
        params: &crate::readiness::ReadinessParams,
    ) -> Self {
        use crate::config::GenerationCheckSpec as Spec;
        let base = base_url.trim_end_matches('/');
        let generation = match (&params.chat, generation) {
            (Some(chat), _) => GenerationCheck::Chat {
                base_url: base.to_owned(),
                chat: chat.clone(),
            },
            (None, Spec::Completion) => GenerationCheck::Completion {
                base_url: base.to_owned(),
            },
            (None, Spec::Get(path)) => GenerationCheck::Get {
                url: format!("{base}{path}"),
                path: path.clone(),
            },
            // A router started without the orchestrator's chat probe: its
            // own GET would prove nothing (ROUTER-NOTES.md), so the check
            // is a completion through it, which only a working pair answers.
            (None, Spec::ThroughRouter) => GenerationCheck::Completion {
                base_url: base.to_owned(),
            },
        };
        HttpChecker {
            client,
            health_url: format!("{base}{health_path}"),
            health_timeout: params.health_timeout,
            // Engines (not routers): SGLang's `/get_server_info` and
            // vLLM's `/version` both carry a `version` field.
            version_urls: if params.chat.is_none() && !matches!(generation, GenerationCheck::Chat { .. }) {
                vec![format!("{base}/get_server_info"), format!("{base}/version")]
            } else {
                Vec::new()
            },
            generation,
            check_timeout: params.check_timeout,
        }
    }
}

impl Checker for HttpChecker {
    async fn version(&self) -> Option<String> {
        for url in &self.version_urls {
            let ask = async {
                let resp = self.client.get(url).send().await.ok()?;
                if !resp.status().is_success() {
                    return None;
                }
                let body = read_body_limited(resp, 1 << 20).await.ok()?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                v.get("version")?
                    .as_str()
                    .map(|s| s.chars().take(64).collect::<String>())
            };
            if let Ok(Some(v)) = tokio::time::timeout(self.health_timeout, ask).await {
                return Some(v);
            }
        }
        None
    }

    async fn health(&self) -> HealthObservation {
        let started = Instant::now();
        let req = self.client.get(&self.health_url).send();
        let result = tokio::time::timeout(self.health_timeout, req).await;
        let latency = started.elapsed();
        match result {
            Err(_) => HealthObservation::TimedOut {
                after: self.health_timeout,
            },
            Ok(Ok(resp)) => HealthObservation::Status {
                status: resp.status().as_u16(),
                latency,
            },
            Ok(Err(e)) if e.is_connect() => HealthObservation::Refused {
                error: root_cause(&e),
                latency,
            },
            Ok(Err(e)) => HealthObservation::Failed {
                error: error_chain(&e),
                latency,
            },
        }
    }

    async fn generation(&self) -> GenerationObservation {
        match &self.generation {
            GenerationCheck::Chat { .. } | GenerationCheck::Completion { .. } => {
                let (r, what) = match &self.generation {
                    GenerationCheck::Chat { base_url, chat } => (
                        chat_probe(&self.client, base_url, chat, self.check_timeout).await,
                        "chat completion",
                    ),
                    GenerationCheck::Completion { base_url } => (
                        engine_completion(&self.client, base_url, self.check_timeout).await,
                        "completion sent to the engine",
                    ),
                    GenerationCheck::Get { .. } => unreachable!("matched above"),
                };
                match r.outcome {
                    ProbeOutcome::Ok => GenerationObservation::Passed {
                        latency: r.latency,
                        tokens: r.tokens,
                        detail: format!(
                            "generation check: {} in {} ms ({what}, request id {})",
                            if r.tokens == 1 {
                                "1 token".to_owned()
                            } else {
                                format!("{} tokens", r.tokens)
                            },
                            r.latency.as_millis(),
                            r.request_id
                        ),
                        http_status: r.http_status,
                        request_id: r.request_id,
                    },
                    ProbeOutcome::Timeout => GenerationObservation::TimedOut {
                        after: self.check_timeout,
                        http_status: r.http_status,
                        request_id: r.request_id,
                    },
                    _ => GenerationObservation::Failed {
                        latency: r.latency,
                        reason: format!("{what} failed ({})", r.error),
                        http_status: r.http_status,
                        request_id: r.request_id,
                    },
                }
            }
            GenerationCheck::Get { url, path } => {
                let started = Instant::now();
                // Known once the headers arrive, even if the body then stalls
                // or breaks: that is evidence too.
                let mut http_status = 0u16;
                let exchange = async {
                    let resp = self
                        .client
                        .get(url)
                        .header(
                            REQUEST_ID_HEADER,
                            format!("{REQUEST_ID_PREFIX}{}", uuid::Uuid::new_v4()),
                        )
                        .header(PROBE_HEADER, "1")
                        .send()
                        .await
                        .map_err(|e| error_chain(&e))?;
                    let status = resp.status();
                    http_status = status.as_u16();
                    // Read the body so the check covers the whole answer
                    // (bounded: a broken engine must not fill our memory).
                    read_body_limited(resp, MAX_HEALTH_BYTES)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok::<_, String>(status)
                };
                let result = tokio::time::timeout(self.check_timeout, exchange).await;
                let latency = started.elapsed();
                // GET checks report no request id (the proto's is the chat check's).
                let request_id = String::new();
                match result {
                    Err(_) => GenerationObservation::TimedOut {
                        after: self.check_timeout,
                        http_status,
                        request_id,
                    },
                    Ok(Ok(status)) if status.is_success() => GenerationObservation::Passed {
                        latency,
                        tokens: 0,
                        detail: format!(
                            "generation check: GET {path} {} in {} ms",
                            status.as_u16(),
                            latency.as_millis()
                        ),
                        http_status,
                        request_id,
                    },
                    Ok(Ok(status)) => GenerationObservation::Failed {
                        latency,
                        reason: format!("GET {path} answered {}", status.as_u16()),
                        http_status,
                        request_id,
                    },
                    Ok(Err(e)) => GenerationObservation::Failed {
                        latency,
                        reason: format!("GET {path} failed ({e})"),
                        http_status,
                        request_id,
                    },
                }
            }
        }
    }
}

fn root_cause(e: &reqwest::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile engine on loopback: answers every request with `head` and
    /// then `body_chunk` repeated until the client hangs up.
    async fn hostile_engine(head: &'static str, body_chunk: &'static [u8], endless: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    if sock.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    loop {
                        if sock.write_all(body_chunk).await.is_err() || !endless {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    fn chat() -> ChatProbe {
        ChatProbe {
            model: "m".into(),
            prompt: "hi".into(),
            max_tokens: 1,
            greedy: false,
        }
    }

    // Property: an endless answer is cut at MAX_ANSWER_BYTES, with a clear
    // error, well before the probe's timeout; memory stays bounded.
    #[tokio::test]
    async fn endless_answer_is_bounded() {
        let url = hostile_engine(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n",
            &[b'x'; 65536],
            true,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &chat(), Duration::from_secs(30)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error);
        assert!(r.error.contains("larger than"), "{}", r.error);
        assert!(r.latency < Duration::from_secs(30));
    }

    // Property: invalid UTF-8 and garbage are errors, never panics.
    #[tokio::test]
    async fn garbage_answer_is_an_error() {
        let url = hostile_engine(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4\r\n\r\n",
            &[0xff, 0xfe, b'{', 0x80],
            false,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &chat(), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error);
        assert!(r.error.starts_with("response is not JSON"), "{}", r.error);
    }

    // Property: tokens come from usage.completion_tokens, else 1 for non-empty content.
    #[test]
    fn token_count_rules() {
        assert_eq!(completion_tokens(&json!({"usage": {"completion_tokens": 7}})), 7);
        let content_only = json!({"choices": [{"message": {"content": "hi"}}]});
        assert_eq!(completion_tokens(&content_only), 1);
        let empty = json!({"choices": [{"message": {"content": ""}}], "usage": {"completion_tokens": 0}});
        assert_eq!(completion_tokens(&empty), 0);
        assert_eq!(completion_tokens(&json!({})), 0);
    }

    /// An engine on loopback answering every request 200 with `body` (JSON).
    async fn answering(body: &'static str) -> String {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        hostile_engine(Box::leak(head.into_boxed_str()), body.as_bytes(), false).await
    }

    fn asking(max_tokens: u32) -> ChatProbe {
        ChatProbe { max_tokens, ..chat() }
    }

    /// Property (issue 30): a 200 whose finish_reason says the engine ended
    /// the request — a string, or SGLang's object with a `type` — is an
    /// Error naming it, with the tokens asked and received and the reason
    /// reported; "length" and "stop" answers are OK with theirs.
    #[tokio::test]
    async fn an_aborted_or_errored_finish_is_an_error_with_its_evidence() {
        let url = answering(
            r#"{"choices":[{"message":{"content":"The"},"finish_reason":{"type":"abort","message":"Abort in waiting queue"}}],"usage":{"completion_tokens":1}}"#,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &asking(16), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error, "{r:?}");
        assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (1, 16, "abort"));
        assert_eq!(r.http_status, 200);
        assert_eq!(
            r.error,
            "finish_reason \"abort\" after 1 of 16 tokens: Abort in waiting queue"
        );

        let url =
            answering(r#"{"choices":[{"text":"x","finish_reason":"error"}],"usage":{"completion_tokens":3}}"#).await;
        let r = chat_probe(&http_client(), &url, &asking(8), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error);
        assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (3, 8, "error"));

        let url = answering(
            r#"{"choices":[{"message":{"content":"a b"},"finish_reason":"length"}],"usage":{"completion_tokens":8}}"#,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &asking(8), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (8, 8, "length"));

        // A short answer with no finish_reason is reported as it is: OK
        // here, judged by the orchestrator (tokens < asked, no stop/length).
        let url = answering(
            r#"{"choices":[{"message":{"content":"a"},"finish_reason":null}],"usage":{"completion_tokens":2}}"#,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &asking(8), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok);
        assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (2, 8, ""));
    }

    /// Property (issue 30): a 200 whose body is an error — `{"error": …}`
    /// or vLLM's `{"object": "error", …}` — is an Error carrying its message.
    #[tokio::test]
    async fn an_error_body_with_status_200_is_an_error() {
        for (body, message) in [
            (
                r#"{"error":{"message":"KV transfer failed","type":"InternalServerError","code":500}}"#,
                "KV transfer failed",
            ),
            (
                r#"{"object":"error","message":"The engine is dead","type":"BadRequestError","code":400}"#,
                "The engine is dead",
            ),
            (r#"{"error":"rejected"}"#, "rejected"),
        ] {
            let url = answering(body).await;
            let r = chat_probe(&http_client(), &url, &asking(4), Duration::from_secs(10)).await;
            assert_eq!(r.outcome, ProbeOutcome::Error, "{body}");
            assert_eq!(r.error, format!("http 200 carrying an error: {message}"));
            assert_eq!(r.tokens_asked, 4);
        }
    }

    /// The engine check asks for one token; that is what it reports.
    #[tokio::test]
    async fn the_engine_completion_reports_one_token_asked() {
        let url = answering(r#"{"data":[{"id":"m"}],"choices":[{"text":"x","finish_reason":"length"}],"usage":{"completion_tokens":1}}"#).await;
        let r = engine_completion(&http_client(), &url, Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (1, 1, "length"));
    }

    // Property: finish reasons and error bodies are read whatever shape
    // they come in; anything else is none, never a panic.
    #[test]
    fn finish_reasons_and_error_bodies_are_read_in_every_shape() {
        assert_eq!(finish_reason_of(&json!("stop")), Some(("stop".into(), None)));
        assert_eq!(
            finish_reason_of(&json!({"type": "abort", "message": "client gone"})),
            Some(("abort".into(), Some("client gone".into())))
        );
        assert_eq!(
            finish_reason_of(&json!({"type": "length", "length": 8})),
            Some(("length".into(), None))
        );
        for v in [
            json!(null),
            json!(3),
            json!({"message": "x"}),
            json!([]),
            json!({"type": 1}),
        ] {
            assert_eq!(finish_reason_of(&v), None, "{v}");
        }
        assert_eq!(
            finish_reason_of(&json!("x".repeat(1000))).unwrap().0.len(),
            MAX_FINISH_REASON_CHARS
        );
        assert_eq!(
            error_message_of(&json!({"error": {"message": "boom"}})),
            Some("boom".into())
        );
        assert_eq!(
            error_message_of(&json!({"error": {"code": 1}})),
            Some("{\"code\":1}".into())
        );
        assert_eq!(
            error_message_of(&json!({"object": "error", "message": "dead"})),
            Some("dead".into())
        );
        for v in [
            json!({"error": null}),
            json!({"error": ""}),
            json!({"object": "chat.completion"}),
            json!("error"),
            json!({"choices": []}),
        ] {
            assert_eq!(error_message_of(&v), None, "{v}");
        }
        assert!(is_failed_finish("abort") && is_failed_finish("error"));
        assert!(!is_failed_finish("stop") && !is_failed_finish("length") && !is_failed_finish(""));
    }

    /// A stub engine on loopback (axum): answers every chat completion 200
    /// with `answer` and records the bodies it was sent.
    async fn recording(answer: &'static str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
        let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
                seen.lock().unwrap().push(body);
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], answer) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), bodies)
    }

    fn greedy(max_tokens: u32) -> ChatProbe {
        ChatProbe {
            max_tokens,
            greedy: true,
            ..chat()
        }
    }

    /// What vLLM sends (`ChatCompletionResponse`): `bytes` optional,
    /// `stop_reason`, the logprob floored at -9999.0.
    const VLLM_GREEDY: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there","tool_calls":[]},"logprobs":{"content":[{"token":"Hello","logprob":-0.0123,"bytes":[72,101,108,108,111],"top_logprobs":[{"token":"Hello","logprob":-0.0123,"bytes":[72,101,108,108,111]},{"token":"Hi","logprob":-4.5,"bytes":[72,105]}]},{"token":" there","logprob":-9999.0,"bytes":null,"top_logprobs":[{"token":" there","logprob":-9999.0},{"token":"!","logprob":-9999.0}]}]},"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}}"#;
    /// What SGLang sends (`ChatCompletionResponse`): `bytes` always, the
    /// fields in its order, `matched_stop`, `metadata`.
    const SGLANG_GREEDY: &str = r#"{"id":"a1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there","reasoning_content":null,"tool_calls":null},"logprobs":{"content":[{"token":"Hello","bytes":[72,101,108,108,111],"logprob":-0.0123,"top_logprobs":[{"token":"Hello","bytes":[72,101,108,108,111],"logprob":-0.0123},{"token":"Hi","bytes":[72,105],"logprob":-4.5}]},{"token":" there","bytes":[32,116,104,101,114,101],"logprob":-9999.0,"top_logprobs":[{"token":" there","bytes":[32],"logprob":-9999.0},{"token":"!","bytes":[33],"logprob":-9999.0}]}]},"finish_reason":"length","matched_stop":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":null,"reasoning_tokens":0},"metadata":{"weight_version":"default"}}"#;

    fn alt(token: &str, logprob: f64) -> TokenAlternative {
        TokenAlternative {
            token: token.into(),
            logprob,
        }
    }

    /// Property (issue 34): a greedy probe asks for seed 0 and two
    /// alternatives at temperature 0, and a vLLM-shaped and an SGLang-shaped
    /// answer read to the same tokens, logprobs and alternatives, in order.
    #[tokio::test]
    async fn vllm_and_sglang_greedy_answers_read_the_same() {
        let expected = vec![
            AnswerToken {
                token: "Hello".into(),
                logprob: -0.0123,
                top: vec![alt("Hello", -0.0123), alt("Hi", -4.5)],
            },
            AnswerToken {
                token: " there".into(),
                logprob: -9999.0,
                top: vec![alt(" there", -9999.0), alt("!", -9999.0)],
            },
        ];
        for answer in [VLLM_GREEDY, SGLANG_GREEDY] {
            let (url, bodies) = recording(answer).await;
            let r = chat_probe(&http_client(), &url, &greedy(2), Duration::from_secs(10)).await;
            assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
            assert_eq!((r.tokens, r.tokens_asked, r.finish_reason.as_str()), (2, 2, "length"));
            assert_eq!(r.answer, expected, "{answer}");
            assert!(!r.answer_logprobs_missing);
            let body = bodies.lock().unwrap().pop().unwrap();
            assert_eq!(body["temperature"], 0);
            assert_eq!(body["seed"], 0);
            assert_eq!(body["logprobs"], true);
            assert_eq!(body["top_logprobs"], 5);
            assert_eq!(body["max_tokens"], 2);
            assert_eq!(body["stream"], false);
        }
    }

    /// Property (issue 34): a probe that is not greedy asks for no logprobs
    /// and reports no answer, even from an engine that sends logprobs.
    #[tokio::test]
    async fn a_probe_that_is_not_greedy_asks_and_reports_no_answer() {
        let (url, bodies) = recording(VLLM_GREEDY).await;
        let r = chat_probe(&http_client(), &url, &asking(2), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert!(r.answer.is_empty() && !r.answer_logprobs_missing, "{r:?}");
        let body = bodies.lock().unwrap().pop().unwrap();
        for field in ["seed", "logprobs", "top_logprobs"] {
            assert!(body.get(field).is_none(), "{field} in {body}");
        }
        assert_eq!(body["temperature"], 0);
    }

    /// Property (issue 34): a greedy answer without logprobs — SGLang's and
    /// vLLM's `"logprobs": null`, vLLM's `{"content": null}`, none at all, an
    /// empty list — is OK with the missing flag set and no answer.
    #[tokio::test]
    async fn a_greedy_answer_without_logprobs_sets_the_missing_flag() {
        for answer in [
            r#"{"choices":[{"message":{"content":"Hello"},"logprobs":null,"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#,
            r#"{"choices":[{"message":{"content":"Hello"},"logprobs":{"content":null},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#,
            r#"{"choices":[{"message":{"content":"Hello"},"logprobs":{"content":[]},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#,
            r#"{"choices":[{"message":{"content":"Hello"},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#,
        ] {
            let (url, _) = recording(answer).await;
            let r = chat_probe(&http_client(), &url, &greedy(4), Duration::from_secs(10)).await;
            assert_eq!(r.outcome, ProbeOutcome::Ok, "{answer}: {r:?}");
            assert!(r.answer_logprobs_missing, "{answer}");
            assert!(r.answer.is_empty());
        }
        // An error body is an error, not an answer without logprobs.
        let (url, _) = recording(r#"{"error":{"message":"boom"}}"#).await;
        let r = chat_probe(&http_client(), &url, &greedy(4), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error);
        assert!(!r.answer_logprobs_missing && r.answer.is_empty());
    }

    /// Property (issue 34): an aborted greedy answer is an Error that still
    /// carries the tokens it got (evidence).
    #[tokio::test]
    async fn an_aborted_greedy_answer_keeps_its_tokens() {
        let (url, _) = recording(
            r#"{"choices":[{"message":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-1.5,"top_logprobs":[]}]},"finish_reason":{"type":"abort","message":"KV transfer failed"}}],"usage":{"completion_tokens":1}}"#,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &greedy(8), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Error, "{r:?}");
        assert_eq!(r.answer.len(), 1);
        assert_eq!((r.answer[0].token.as_str(), r.answer[0].logprob), ("Hi", -1.5));
    }

    /// Property (issue 34): the directed prefill → decode probe asks both
    /// for logprobs and carries the decode's answer, not the prefill's.
    #[tokio::test]
    async fn the_pd_path_probe_carries_the_decodes_answer() {
        let (prefill, prefill_bodies) = recording(
            r#"{"choices":[{"message":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":"length"}],"usage":{"completion_tokens":1}}"#,
        )
        .await;
        let (decode, decode_bodies) = recording(VLLM_GREEDY).await;
        let path = pdwarden_proto::v1::PdPath {
            decode_url: decode,
            bootstrap_host: "127.0.0.1".into(),
            bootstrap_port: 8998,
            prefill_url: String::new(),
        };
        let r = pd_path_probe(&http_client(), &prefill, &path, &greedy(2), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!(
            r.answer.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
            ["Hello", " there"]
        );
        let (p, d) = (
            prefill_bodies.lock().unwrap().pop().unwrap(),
            decode_bodies.lock().unwrap().pop().unwrap(),
        );
        assert_eq!(p, d, "the same body to both");
        assert_eq!((d["logprobs"].clone(), d["seed"].clone()), (json!(true), json!(0)));
    }

    /// Issue 37: a prefill with no bootstrap port (vLLM) is met as vLLM's
    /// PD proxy meets it: one token with `do_remote_decode`, then the
    /// decode with the `kv_transfer_params` the prefill answered; the
    /// decode's answer is the outcome.
    #[tokio::test]
    async fn a_vllm_path_probe_hands_the_prefills_kv_params_to_the_decode() {
        let (prefill, prefill_bodies) = recording(
            r#"{"choices":[{"message":{"content":"x"},"finish_reason":"length"}],"usage":{"completion_tokens":1},"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e-1","remote_block_ids":[3,4],"remote_host":"127.0.0.1","remote_port":5600}}"#,
        )
        .await;
        let (decode, decode_bodies) = recording(VLLM_GREEDY).await;
        let path = pdwarden_proto::v1::PdPath {
            decode_url: decode,
            bootstrap_host: "127.0.0.1".into(),
            bootstrap_port: 0,
            prefill_url: String::new(),
        };
        let r = pd_path_probe(&http_client(), &prefill, &path, &greedy(2), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!(r.answer.len(), 2, "the decode's answer: {r:?}");
        let (p, d) = (
            prefill_bodies.lock().unwrap().pop().unwrap(),
            decode_bodies.lock().unwrap().pop().unwrap(),
        );
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(d["max_tokens"], 2);
        assert_eq!(d["kv_transfer_params"]["remote_engine_id"], "e-1");
        assert_eq!(d["kv_transfer_params"]["remote_block_ids"], json!([3, 4]));
        assert!(d.get("bootstrap_port").is_none(), "{d}");
        // A prefill that fails: the path fails, naming the prefill.
        let (bad, _) = recording(r#"{"object":"error","message":"boom","code":500}"#).await;
        let r = pd_path_probe(&http_client(), &bad, &path, &greedy(2), Duration::from_secs(10)).await;
        assert_ne!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert!(r.error.starts_with("prefill "), "{r:?}");
    }

    /// Property (issue 34): an answer is bounded whatever the engine sends:
    /// no more entries than `max_tokens`, tokens and alternatives cut at 256
    /// bytes on a char boundary, at most 5 alternatives, odd entries kept in
    /// place, non-numbers NaN, and the encoded budget.
    #[tokio::test]
    async fn a_greedy_answer_is_bounded() {
        // More entries than max_tokens: the first max_tokens, in order.
        let (url, _) = recording(
            r#"{"choices":[{"message":{"content":"abcde"},"logprobs":{"content":[{"token":"a","logprob":-1},{"token":"b","logprob":-2},{"token":"c","logprob":-3},{"token":"d","logprob":-4},{"token":"e","logprob":-5}]},"finish_reason":"length"}],"usage":{"completion_tokens":5}}"#,
        )
        .await;
        let r = chat_probe(&http_client(), &url, &greedy(2), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!(
            r.answer
                .iter()
                .map(|t| (t.token.as_str(), t.logprob))
                .collect::<Vec<_>>(),
            [("a", -1.0), ("b", -2.0)]
        );

        // An over-long token: cut at 256 bytes, back to a char boundary.
        let long = format!("a{}", "é".repeat(200));
        let body = json!({"choices": [{"message": {"content": long}, "logprobs": {"content": [
            {"token": long, "logprob": -0.5, "top_logprobs": [{"token": "é".repeat(300), "logprob": -1.0}]}
        ]}, "finish_reason": "length"}], "usage": {"completion_tokens": 1}});
        let (url, _) = recording(Box::leak(body.to_string().into_boxed_str())).await;
        let r = chat_probe(&http_client(), &url, &greedy(1), Duration::from_secs(10)).await;
        assert_eq!(r.outcome, ProbeOutcome::Ok, "{r:?}");
        assert_eq!(r.answer[0].token.len(), 255, "256 is inside an é");
        assert!(long.starts_with(&r.answer[0].token));
        assert_eq!(r.answer[0].top[0].token, "é".repeat(128));

        // Odd shapes, straight through the reader.
        let v = json!({"choices": [{"logprobs": {"content": [
            {"token": "x", "logprob": null, "top_logprobs": (0..9).map(|i| json!({"token": i.to_string(), "logprob": -f64::from(i)})).collect::<Vec<_>>()},
            7,
            {"token": 3, "logprob": "-1"},
            {"token": "y", "logprob": -1e308, "top_logprobs": null},
        ]}}]});
        let a = answer_of(&v, 10).unwrap();
        assert_eq!(a.len(), 4, "every entry keeps its place");
        assert!(a[0].logprob.is_nan(), "null is NaN");
        assert_eq!(
            a[0].top.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
            ["0", "1", "2", "3", "4"]
        );
        assert_eq!((a[1].token.as_str(), a[1].top.len()), ("", 0));
        assert!(a[1].logprob.is_nan());
        assert_eq!(a[2].token, "");
        assert!(a[2].logprob.is_nan(), "a string is not a logprob");
        assert_eq!((a[3].token.as_str(), a[3].logprob), ("y", -1e308));
        assert_eq!(answer_of(&v, 0), Some(Vec::new()));

        // The encoded budget: huge tokens stop well before max_tokens.
        let huge = json!({"token": "t".repeat(1000), "logprob": -1.0,
            "top_logprobs": vec![json!({"token": "u".repeat(1000), "logprob": -2.0}); 9]});
        let v = json!({"choices": [{"logprobs": {"content": vec![huge; 1000]}}]});
        let a = answer_of(&v, 4096).unwrap();
        let encoded: usize = a.iter().map(answer_entry_len).sum();
        assert!(a.len() < 1000 && !a.is_empty(), "{}", a.len());
        assert!(encoded <= MAX_ANSWER_ENCODED_BYTES);
        assert!(encoded + answer_entry_len(&a[0]) > MAX_ANSWER_ENCODED_BYTES);
    }

    #[test]
    fn snippet_truncates_on_char_boundaries() {
        let long = "é".repeat(300);
        let s = snippet(&long);
        assert_eq!(s.chars().count(), 201);
    }
}
