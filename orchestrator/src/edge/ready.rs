//! A plain-HTTP readiness endpoint for load balancers and gateways.
//!
//! Gateways (LiteLLM-style background health checks, an L7 balancer) probe
//! the model themselves today, each with its own prompts, which is how
//! INCIDENTS row 5 happened. Here they read pdwarden's latest verdict
//! instead, at no cost to the engines:
//!
//! - `GET /ready/pair/NAME` → 200 when the pair is `healthy`, else 503; the
//!   body is the pair's watch view (state, reasons with numbers, units).
//! - `GET /ready/unit/HOST/UNIT` → 200 when that engine serves or idles.
//! - `GET /ready` → every pair; 200 only if all are ready.
//! - `GET /metrics` → Prometheus gauges: readiness, held pairs (a held pair
//!   is an alert), recoveries in the window, probes sent, the watch's own
//!   restarts after a panic; and the histogram
//!   `pdwarden_wedge_detection_seconds{pair,kind}` of time to detect a wedge.
//!
//! Deliberately tiny (HTTP/1.1, GET only, `Connection: close`) so it
//! cannot hold the orchestrator up: each connection has a
//! 5 s budget.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::ops::telemetry::VERDICTS;
use crate::ops::watcher::{WATCH_STATES, WatchBoard, WatchPairLabels};

const MAX_HEAD: usize = 8 * 1024;
const CONNECTION_BUDGET: Duration = Duration::from_secs(5);

/// Serves readiness on `listener` until `shutdown` turns true.
pub async fn serve(listener: TcpListener, board: WatchBoard, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                let board = board.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(CONNECTION_BUDGET, handle(stream, &board)).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "readiness endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle(mut stream: TcpStream, board: &WatchBoard) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = if method != "GET" {
        (405, "application/json", json!({"error": "only GET"}).to_string())
    } else {
        route(path.split('?').next().unwrap_or(""), board)
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// (status, content type, body) for a GET of `path`.
pub fn route(path: &str, board: &WatchBoard) -> (u16, &'static str, String) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = |what: String| (404, "application/json", json!({ "error": what }).to_string());
    let ready = |ok: bool| if ok { 200 } else { 503 };
    match segments.as_slice() {
        ["ready"] => {
            let pairs = board.all();
            let all = !pairs.is_empty() && pairs.iter().all(|p| p.ready);
            (
                ready(all),
                "application/json",
                json!({ "ready": all, "pairs": pairs }).to_string(),
            )
        }
        ["ready", "pair", name] => match board.get(name) {
            Some(p) => (
                ready(p.ready),
                "application/json",
                serde_json::to_string(&p).unwrap_or_default(),
            ),
            None => not_found(format!("no watched pair named {name:?}")),
        },
        ["ready", "unit", host, unit] => {
            let found = board
                .all()
                .into_iter()
                .flat_map(|p| p.units.into_iter().map(move |u| (p.pair.clone(), u)))
                .find(|(_, u)| u.host == *host && u.unit == *unit);
            match found {
                Some((pair, u)) => (
                    ready(u.ready()),
                    "application/json",
                    json!({ "pair": pair, "ready": u.ready(), "unit": u }).to_string(),
                ),
                None => not_found(format!("no watched unit {host}/{unit}")),
            }
        }
        ["metrics"] => (200, pdwarden_proto::exposition::CONTENT_TYPE, metrics(board)),
        _ => not_found(format!("no such endpoint {path:?}")),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairLabel {
    pair: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairStateLabels {
    pair: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairVerdictLabels {
    pair: String,
    verdict: String,
}

/// One figure of a pair's watch view, as a gauge value.
type PairFigure = fn(&pdwarden_model::watch::PairWatchView) -> f64;

/// One count of a pair's watch view, as a counter.
type PairCount = fn(&pdwarden_model::watch::PairWatchView) -> u64;

/// The board in Prometheus text format (`prometheus-client`, as the
/// classic text: [`pdwarden_proto::exposition`]): per-pair gauges and
/// counters from the latest views, the watch state and the last verdict as
/// state sets (one series per state, 1 for the current one: an alert
/// matches `pdwarden_pair_watch_state{state="held"} == 1`), the probe and
/// wedge-detection histograms, and the operations' series.
pub fn metrics(board: &WatchBoard) -> String {
    let pairs = board.all();
    let mut registry = Registry::default();
    let gauges: [(&str, &str, PairFigure); 3] = [
        (
            "pdwarden_pair_ready",
            "1 when the pair's latest watch verdict is healthy",
            |p| f64::from(u8::from(p.ready)),
        ),
        (
            "pdwarden_pair_held",
            "1 when the circuit breaker holds the pair for a human",
            |p| f64::from(u8::from(p.held.is_some())),
        ),
        (
            "pdwarden_pair_recoveries_in_window",
            "Automatic recoveries within the breaker's window",
            |p| f64::from(p.recoveries_in_window),
        ),
    ];
    for (name, help, value) in gauges {
        let family = Family::<PairLabel, Gauge<f64, AtomicU64>>::default();
        for p in &pairs {
            family.get_or_create(&PairLabel { pair: p.pair.clone() }).set(value(p));
        }
        registry.register(name, help, family);
    }
    let counters: [(&str, &str, PairCount); 2] = [
        (
            "pdwarden_watch_probes",
            "Active probes the watch sent through the pair's router",
            |p| p.probes_sent,
        ),
        (
            "pdwarden_watch_probes_deferred",
            "Probes the watch held back because the pair was busy or an operation ran",
            |p| p.probes_deferred,
        ),
    ];
    for (name, help, value) in counters {
        let family = Family::<PairLabel, Counter>::default();
        for p in &pairs {
            family
                .get_or_create(&PairLabel { pair: p.pair.clone() })
                .inc_by(value(p));
        }
        registry.register(name, help, family);
    }
    let states = Family::<PairStateLabels, Gauge>::default();
    for p in &pairs {
        for s in WATCH_STATES {
            states
                .get_or_create(&PairStateLabels {
                    pair: p.pair.clone(),
                    state: (*s).to_string(),
                })
                .set(i64::from(p.state == *s));
        }
    }
    registry.register(
        "pdwarden_pair_watch_state",
        format!(
            "The pair's watch state: 1 for the current one ({})",
            WATCH_STATES.join(", ")
        ),
        states,
    );
    // Every watched pair has its series, 0 until its watch first panics.
    for p in &pairs {
        let _ = board.restarts.get_or_create(&WatchPairLabels { pair: p.pair.clone() });
    }
    registry.register(
        "pdwarden_watch_restarts",
        "Times the pair's watch panicked and was restarted (it shows watch_failed meanwhile)",
        board.restarts.clone(),
    );
    let verdicts = Family::<PairVerdictLabels, Gauge>::default();
    for (pair, last) in board.operations.last_verdicts() {
        for v in VERDICTS {
            verdicts
                .get_or_create(&PairVerdictLabels {
                    pair: pair.clone(),
                    verdict: (*v).to_string(),
                })
                .set(i64::from(last == *v));
        }
    }
    registry.register(
        "pdwarden_pair_last_verdict",
        "The verdict of the pair's latest co-restart or verification: 1 for it",
        verdicts,
    );
    registry.register(
        "pdwarden_watch_probe_duration_seconds",
        "Time each of the watch's probes took to answer (or to time out), by pair and outcome",
        board.probe_latency.clone(),
    );
    registry.register(
        "pdwarden_wedge_detection_seconds",
        "Time from a wedge's onset (the moment its silence began) to its confirmation, per pair and kind",
        board.detection.clone(),
    );
    board.operations.register(&mut registry);
    // Several orchestrators on etcd (issue 19): alert when none leads
    // (`sum(pdwarden_orchestrator_leading) == 0`), or two do.
    let leading = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    leading.set(i64::from(board.leadership.leads()));
    registry.register(
        "pdwarden_orchestrator_leading",
        "1 when this orchestrator commands the agents (the sole one on SQLite, or the elected leader on etcd)",
        leading,
    );
    let token = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
    token.set(board.leadership.token() as i64);
    registry.register(
        "pdwarden_orchestrator_fencing_token",
        "The leader's fencing token (the etcd revision it was elected at; 0 when not leading or on SQLite)",
        token,
    );
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    pdwarden_proto::exposition::prometheus_text(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::watcher::WedgeLabels;

    /// The exposition carries the detection-time histogram per pair and
    /// kind, in Prometheus text format (buckets, sum, count).
    #[test]
    fn metrics_expose_the_wedge_detection_histogram() {
        let board = WatchBoard::default();
        let labels = WedgeLabels {
            pair: "demo".into(),
            kind: "kv_transfer".into(),
        };
        board.detection.get_or_create(&labels).observe(2.7);
        board.detection.get_or_create(&labels).observe(40.0);
        let text = metrics(&board);
        assert!(
            text.contains("# TYPE pdwarden_wedge_detection_seconds histogram"),
            "{text}"
        );
        assert!(!text.contains(".."), "one full stop per help text: {text}");
        assert!(
            text.contains(r#"pdwarden_wedge_detection_seconds_count{pair="demo",kind="kv_transfer"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pdwarden_wedge_detection_seconds_bucket{le="4.0",pair="demo",kind="kv_transfer"} 1"#),
            "{text}"
        );
    }

    /// Issue 18: every series the orchestrator serves — pairs, watch states,
    /// last verdicts, probes, wedges, operations, gate decisions, automatic
    /// recoveries — passes `promtool check metrics`, and names what an
    /// operator reads: the watch state as a state set, counters `_total`.
    #[test]
    fn promtool_accepts_every_series() {
        use crate::ops::telemetry::Concluded;
        use crate::ops::watcher::ProbeLabels;
        let leadership = crate::edge::leadership::Leadership::candidate("http://a:1", std::time::Duration::ZERO);
        leadership.set(pdwarden_model::status::Role::Leader {
            token: 42,
            since_unix_ms: 0,
        });
        let board = WatchBoard::with_leadership(leadership);
        board
            .detection
            .get_or_create(&WedgeLabels {
                pair: "demo".into(),
                kind: "stall".into(),
            })
            .observe(9.5);
        board
            .probe_latency
            .get_or_create(&ProbeLabels {
                pair: "demo".into(),
                outcome: "ok".into(),
            })
            .observe(0.08);
        board
            .restarts
            .get_or_create(&crate::ops::watcher::WatchPairLabels { pair: "demo".into() })
            .inc();
        let report = serde_json::json!({
            "total_ms": 52000,
            "steps": [{"name": "restarting_prefill", "unit": "prefill-0", "started_ms": 0, "ended_ms": 26000, "outcome": "ok"}],
        });
        for (kind, request_id, verdict) in [
            ("co_restart", None, "healthy"),
            ("co_restart", Some("auto-1"), "healthy"),
            ("gate", None, "rejected_rolled_back"),
        ] {
            board.operations.concluded(&Concluded {
                kind,
                pair: "demo",
                request_id,
                verdict,
                report: &report,
            });
        }
        let text = metrics(&board);
        assert_eq!(pdwarden_proto::exposition::promtool_check(&text), Ok(()), "{text}");
        for line in [
            "# TYPE pdwarden_gate_decisions_total counter",
            r#"pdwarden_automatic_recoveries_total{pair="demo",verdict="healthy"} 1"#,
            r#"pdwarden_pair_last_verdict{pair="demo",verdict="healthy"} 1"#,
            r#"pdwarden_pair_last_verdict{pair="demo",verdict="failed"} 0"#,
            r#"pdwarden_watch_probe_duration_seconds_count{pair="demo",outcome="ok"} 1"#,
            "pdwarden_orchestrator_leading 1",
            "pdwarden_orchestrator_fencing_token 42",
            r#"pdwarden_watch_restarts_total{pair="demo"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
