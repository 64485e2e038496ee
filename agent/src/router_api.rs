//! A router's worker list, through the router's own worker API (issue 18:
//! drain a pair before its restart when its router is shared).
//!
//! The orchestrator reaches no unit directly (DESIGN.md 2): the agent on
//! the router's host calls the API at the router unit's `base_url` and
//! answers with the list the router gives after the call. What the calls
//! are, as read off the real sglang-router 0.3.2 (ROUTER-NOTES.md, "Worker
//! management"):
//! - `GET /workers` → `{"workers":[{"id","url","worker_type","is_healthy",
//!   "load","bootstrap_port",…}],…}`;
//! - `DELETE /workers/{id}` → 202 "Worker removal queued" (the id is the
//!   router's UUID; the removal is applied in the background, ~0.2 s here);
//! - `POST /workers` `{"url","worker_type","bootstrap_port"}` → 202
//!   "Worker addition queued" (routable after its health checks, ~0.5 s).
//!
//! Both calls are queued by the router, so the answer's list may still show
//! the state before them: the orchestrator lists again until the change
//! shows. vllm-router is a fork of the same router with the same routes but
//! not the same ids (`src/server.rs` of vllm-project/router): its
//! `GET /workers` lists no `id` and `DELETE /workers/{url}` takes the
//! worker's URL, percent-encoded. An engine has no worker API and gets a
//! clear error.
//!
//! vllm-router 0.1.17 in PD mode (`--vllm-pd-disaggregation`) removes a PD
//! worker but cannot add one back over HTTP: `POST /workers` and
//! `POST /add_worker` both answer 400 "PD router requires specific
//! add_prefill_server or add_decode_server methods" (run against the real
//! router with pd-sim engines behind it; those methods are internal, no
//! route reaches them). A removal there would leave the pair out of rotation
//! until the router restarts, so it is refused before anything is removed.

use std::time::Duration;

use pdwarden_engines::EngineKind;
use pdwarden_proto::v1::{RouterWorker, RouterWorkers, RouterWorkersOp, RouterWorkersResult};
use serde::Deserialize;

/// Timeout of one request to the router when the command leaves it 0.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 5_000;

#[derive(Deserialize)]
struct Listed {
    workers: Vec<ListedWorker>,
}

#[derive(Deserialize)]
struct ListedWorker {
    #[serde(default)]
    id: String,
    url: String,
    #[serde(default)]
    worker_type: String,
    #[serde(default)]
    is_healthy: bool,
    #[serde(default)]
    load: u64,
    #[serde(default)]
    bootstrap_port: Option<u32>,
}

impl From<ListedWorker> for RouterWorker {
    fn from(w: ListedWorker) -> Self {
        RouterWorker {
            url: w.url,
            worker_type: w.worker_type,
            bootstrap_port: w.bootstrap_port.unwrap_or(0),
            id: w.id,
            healthy: w.is_healthy,
            load: w.load,
        }
    }
}

/// Why a call to the router failed, in the words the result carries.
#[derive(Debug, thiserror::Error)]
pub enum RouterApiError {
    #[error("{kind} has no worker API pdwarden can drive (sglang-router and vllm-router do)")]
    NoWorkerApi { kind: &'static str },
    #[error(
        "vllm-router cannot put a PD worker back over HTTP (its POST /workers answers 400 \"PD router requires specific add_prefill_server or add_decode_server methods\"), so {workers} would stay out of rotation until the router restarts; nothing was removed: drain this pair by restarting its router, or put an sglang-router in front"
    )]
    CannotReAdd { workers: String },
    #[error("{what} {url}: {source}")]
    Request {
        what: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{what} {url}: http {status}: {body}")]
    Status {
        what: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("GET {url}: unreadable worker list: {detail}")]
    Unreadable { url: String, detail: String },
}

/// URLs compare without a trailing slash.
fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The router's worker list.
async fn list(http: &reqwest::Client, base: &str, timeout: Duration) -> Result<Vec<RouterWorker>, RouterApiError> {
    let url = format!("{base}/workers");
    let resp = http
        .get(&url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|source| RouterApiError::Request {
            what: "GET",
            url: url.clone(),
            source,
        })?;
    let status = resp.status();
    let body = resp.text().await.map_err(|source| RouterApiError::Request {
        what: "GET",
        url: url.clone(),
        source,
    })?;
    if !status.is_success() {
        return Err(RouterApiError::Status {
            what: "GET",
            url,
            status: status.as_u16(),
            body: body.chars().take(300).collect(),
        });
    }
    let listed: Listed = serde_json::from_str(&body).map_err(|e| RouterApiError::Unreadable {
        url,
        detail: e.to_string(),
    })?;
    Ok(listed.workers.into_iter().map(RouterWorker::from).collect())
}

/// Sends one queued change (DELETE or POST) and checks it was accepted.
async fn change(
    what: &'static str,
    request: reqwest::RequestBuilder,
    url: String,
    timeout: Duration,
) -> Result<(), RouterApiError> {
    let resp = request
        .timeout(timeout)
        .send()
        .await
        .map_err(|source| RouterApiError::Request {
            what,
            url: url.clone(),
            source,
        })?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = resp.text().await.unwrap_or_default();
    Err(RouterApiError::Status {
        what,
        url,
        status: status.as_u16(),
        body: body.chars().take(300).collect(),
    })
}

/// Carries out `cmd` against the router at `base_url` of kind `kind`.
pub async fn run(
    http: &reqwest::Client,
    kind: EngineKind,
    base_url: &str,
    cmd: &RouterWorkers,
) -> Result<Vec<RouterWorker>, RouterApiError> {
    if !matches!(kind, EngineKind::SglangRouter | EngineKind::VllmRouter) {
        return Err(RouterApiError::NoWorkerApi { kind: kind.as_str() });
    }
    let base = base_url.trim_end_matches('/');
    let timeout = Duration::from_millis(if cmd.request_timeout_ms == 0 {
        DEFAULT_REQUEST_TIMEOUT_MS
    } else {
        cmd.request_timeout_ms
    });
    let op = RouterWorkersOp::try_from(cmd.op).unwrap_or(RouterWorkersOp::Unspecified);
    match op {
        RouterWorkersOp::Unspecified | RouterWorkersOp::List => {}
        RouterWorkersOp::Remove => {
            let pd: Vec<&str> = cmd
                .workers
                .iter()
                .filter(|w| w.worker_type == "prefill" || w.worker_type == "decode")
                .map(|w| w.url.as_str())
                .collect();
            if kind == EngineKind::VllmRouter && !pd.is_empty() {
                return Err(RouterApiError::CannotReAdd { workers: pd.join(", ") });
            }
            for listed in list(http, base, timeout).await? {
                if cmd.workers.iter().any(|w| same_url(&w.url, &listed.url)) {
                    let key = match kind {
                        EngineKind::VllmRouter => {
                            percent_encoding::utf8_percent_encode(&listed.url, percent_encoding::NON_ALPHANUMERIC)
                                .to_string()
                        }
                        _ => listed.id.clone(),
                    };
                    let url = format!("{base}/workers/{key}");
                    change("DELETE", http.delete(&url), url, timeout).await?;
                }
            }
        }
        RouterWorkersOp::Add => {
            let listed = list(http, base, timeout).await?;
            for w in &cmd.workers {
                if listed.iter().any(|l| same_url(&l.url, &w.url)) {
                    continue;
                }
                let mut body = serde_json::json!({ "url": w.url, "worker_type": w.worker_type });
                if w.bootstrap_port != 0 {
                    body["bootstrap_port"] = w.bootstrap_port.into();
                }
                let url = format!("{base}/workers");
                change("POST", http.post(&url).json(&body), url, timeout).await?;
            }
        }
    }
    list(http, base, timeout).await
}

/// The answer to `cmd` with id `command_id`.
pub async fn answer(
    http: &reqwest::Client,
    unit: Option<(EngineKind, String)>,
    command_id: &str,
    cmd: RouterWorkers,
) -> RouterWorkersResult {
    let mut result = RouterWorkersResult {
        command_id: command_id.into(),
        unit: cmd.unit.clone(),
        ..Default::default()
    };
    let Some((kind, base_url)) = unit else {
        result.error = format!("unknown unit {:?}", cmd.unit);
        return result;
    };
    match run(http, kind, &base_url, &cmd).await {
        Ok(workers) => {
            result.ok = true;
            result.workers = workers;
        }
        Err(e) => result.error = e.to_string(),
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A router's list as sglang-router 0.3.2 writes it (ROUTER-NOTES.md):
    /// the fields pdwarden reads, the others ignored.
    #[test]
    fn reads_sglang_routers_worker_list() {
        let text = r#"{"workers":[
            {"id":"7d0e4c68-6417-45d4-b975-0337344f02d0","url":"http://127.0.0.1:41001","model_id":"m",
             "worker_type":"prefill","is_healthy":true,"load":2,"bootstrap_port":41002,"metadata":{}},
            {"id":"088015dd-96c8-46db-b8b5-be44322e319f","url":"http://127.0.0.1:41013",
             "worker_type":"decode","is_healthy":false,"load":0}],"total":2}"#;
        let listed: Listed = serde_json::from_str(text).unwrap();
        let w: Vec<RouterWorker> = listed.workers.into_iter().map(RouterWorker::from).collect();
        assert_eq!(w[0].bootstrap_port, 41002);
        assert_eq!(w[0].load, 2);
        assert!(w[0].healthy);
        assert_eq!(w[1].worker_type, "decode");
        assert_eq!(w[1].bootstrap_port, 0);
        assert!(!w[1].healthy);
    }

    /// Finding (real vllm-router 0.1.17): a PD worker it removed cannot be
    /// added back; the removal is refused before any request is sent (the
    /// URL here answers nothing, so a request would fail differently).
    #[tokio::test]
    async fn vllm_router_refuses_to_remove_a_pd_worker_it_cannot_put_back() {
        let http = reqwest::Client::new();
        let cmd = RouterWorkers {
            op: RouterWorkersOp::Remove as i32,
            workers: vec![RouterWorker {
                url: "http://127.0.0.1:18101".into(),
                worker_type: "prefill".into(),
                bootstrap_port: 18998,
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = run(&http, EngineKind::VllmRouter, "http://127.0.0.1:1", &cmd)
            .await
            .unwrap_err();
        assert!(matches!(err, RouterApiError::CannotReAdd { .. }), "{err}");
        assert!(err.to_string().contains("http://127.0.0.1:18101"), "{err}");
    }

    #[tokio::test]
    async fn an_engine_has_no_worker_api() {
        let http = reqwest::Client::new();
        let err = run(&http, EngineKind::Vllm, "http://127.0.0.1:1", &RouterWorkers::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no worker API"), "{err}");
    }

    #[test]
    fn urls_compare_without_a_trailing_slash() {
        assert!(same_url("http://h:1/", "http://h:1"));
        assert!(!same_url("http://h:1", "http://h:10"));
    }
}
