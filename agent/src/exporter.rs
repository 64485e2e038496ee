//! A small Prometheus endpoint (`GET /metrics`) for the GPU and host figures
//! of the latest snapshot, served when `metrics_listen` is set.
//!
//! It only renders what the reporter already sampled (no reading on
//! scrape), so a scrape costs nothing and never blocks on NVML. The text
//! format is written by hand: a dozen gauges do not need a metrics library.
//! [`render`] is pure and unit-tested.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::gpu::reporter::Latest;

/// Escapes a label value for the text exposition format.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Out {
    text: String,
    declared: Vec<&'static str>,
}

impl Out {
    fn metric(&mut self, name: &'static str, kind: &str, help: &str, labels: &str, value: impl std::fmt::Display) {
        if !self.declared.contains(&name) {
            self.declared.push(name);
            let _ = writeln!(self.text, "# HELP {name} {help}");
            let _ = writeln!(self.text, "# TYPE {name} {kind}");
        }
        if labels.is_empty() {
            let _ = writeln!(self.text, "{name} {value}");
        } else {
            let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
        }
    }
}

/// The exposition text for `latest` on `host`.
pub fn render(host: &str, latest: &Latest) -> String {
    let mut o = Out {
        text: String::new(),
        declared: Vec::new(),
    };
    let h = format!("host=\"{}\"", label(host));
    let Some(s) = &latest.snapshot else {
        o.metric(
            "pdwarden_gpu_reporting_available",
            "gauge",
            "1 when the GPU source reads GPUs, 0 when GPU reporting is off or failing.",
            &h,
            0,
        );
        return o.text;
    };
    o.metric(
        "pdwarden_gpu_reporting_available",
        "gauge",
        "1 when the GPU source reads GPUs, 0 when GPU reporting is off or failing.",
        &format!("{h},source=\"{}\"", label(&s.gpu_source)),
        u8::from(s.gpu_unavailable.is_empty()),
    );
    if let Some(x) = &s.host {
        o.metric(
            "pdwarden_host_cpu_usage_percent",
            "gauge",
            "Host CPU usage, all CPUs together (0-100).",
            &h,
            x.cpu_pct,
        );
        o.metric("pdwarden_host_cpus", "gauge", "Logical CPUs.", &h, x.cpu_count);
        o.metric(
            "pdwarden_host_memory_used_bytes",
            "gauge",
            "Host memory in use.",
            &h,
            x.memory_used_bytes,
        );
        o.metric(
            "pdwarden_host_memory_total_bytes",
            "gauge",
            "Host memory installed.",
            &h,
            x.memory_total_bytes,
        );
        for (window, v) in [("1m", x.load1), ("5m", x.load5), ("15m", x.load15)] {
            o.metric(
                "pdwarden_host_load_average",
                "gauge",
                "Load average.",
                &format!("{h},window=\"{window}\""),
                v,
            );
        }
    }
    for u in &s.units {
        let l = format!("{h},unit=\"{}\"", label(&u.unit));
        o.metric(
            "pdwarden_unit_rss_bytes",
            "gauge",
            "Resident memory of a unit's process tree.",
            &l,
            u.rss_bytes,
        );
        o.metric(
            "pdwarden_unit_cpu_usage_percent",
            "gauge",
            "CPU of a unit's process tree (100 = one CPU).",
            &l,
            u.cpu_pct,
        );
        o.metric(
            "pdwarden_unit_processes",
            "gauge",
            "Processes in a unit's tree (0 when not running).",
            &l,
            u.processes,
        );
    }
    for g in &s.gpus {
        let l = format!(
            "{h},gpu=\"{}\",uuid=\"{}\",name=\"{}\"",
            g.index,
            label(&g.uuid),
            label(&g.name)
        );
        o.metric(
            "pdwarden_gpu_memory_used_bytes",
            "gauge",
            "GPU memory in use.",
            &l,
            g.memory_used_bytes,
        );
        o.metric(
            "pdwarden_gpu_memory_total_bytes",
            "gauge",
            "GPU memory installed.",
            &l,
            g.memory_total_bytes,
        );
        if let Some(v) = g.utilization_gpu_pct {
            o.metric(
                "pdwarden_gpu_utilization_percent",
                "gauge",
                "Time a kernel was running over the driver's sample period.",
                &l,
                v,
            );
        }
        if let Some(v) = g.utilization_memory_pct {
            o.metric(
                "pdwarden_gpu_memory_utilization_percent",
                "gauge",
                "Time device memory was read or written over the driver's sample period.",
                &l,
                v,
            );
        }
        if let Some(v) = g.temperature_c {
            o.metric(
                "pdwarden_gpu_temperature_celsius",
                "gauge",
                "GPU die temperature.",
                &l,
                v,
            );
        }
        if let Some(v) = g.power_draw_mw {
            o.metric(
                "pdwarden_gpu_power_draw_watts",
                "gauge",
                "Power draw.",
                &l,
                f64::from(v) / 1000.0,
            );
        }
        if let Some(v) = g.power_limit_mw {
            o.metric(
                "pdwarden_gpu_power_limit_watts",
                "gauge",
                "Enforced power limit.",
                &l,
                f64::from(v) / 1000.0,
            );
        }
        o.metric(
            "pdwarden_gpu_throttled",
            "gauge",
            "1 while any clock throttle reason other than idle is active.",
            &l,
            u8::from(!g.throttle_reasons.is_empty()),
        );
        if let Some(e) = &g.ecc {
            for (counter, kind, v) in [
                ("volatile", "corrected", e.volatile_corrected),
                ("volatile", "uncorrected", e.volatile_uncorrected),
                ("aggregate", "corrected", e.aggregate_corrected),
                ("aggregate", "uncorrected", e.aggregate_uncorrected),
            ] {
                o.metric(
                    "pdwarden_gpu_ecc_errors",
                    "gauge",
                    "ECC error counts as the driver keeps them (volatile: since driver load).",
                    &format!("{l},counter=\"{counter}\",type=\"{kind}\""),
                    v,
                );
            }
        }
        if let Some(v) = g.retired_pages {
            o.metric("pdwarden_gpu_retired_pages", "gauge", "Retired memory pages.", &l, v);
        }
        if let Some(r) = &g.remapped_rows {
            for (cause, v) in [("correctable", r.correctable), ("uncorrectable", r.uncorrectable)] {
                o.metric(
                    "pdwarden_gpu_remapped_rows",
                    "gauge",
                    "Memory rows remapped, by the kind of error that caused it.",
                    &format!("{l},cause=\"{cause}\""),
                    v,
                );
            }
            o.metric(
                "pdwarden_gpu_row_remap_pending",
                "gauge",
                "1 while a row remapping waits for a GPU reset.",
                &l,
                u8::from(r.pending),
            );
            o.metric(
                "pdwarden_gpu_row_remap_failed",
                "gauge",
                "1 if a row remapping failed (the GPU needs service).",
                &l,
                u8::from(r.failure),
            );
        }
        let foreign: Vec<_> = g.processes.iter().filter(|p| p.foreign).collect();
        o.metric(
            "pdwarden_gpu_foreign_processes",
            "gauge",
            "Processes on the GPU that no supervised unit owns.",
            &l,
            foreign.len(),
        );
        o.metric(
            "pdwarden_gpu_foreign_memory_bytes",
            "gauge",
            "GPU memory held by processes no supervised unit owns.",
            &l,
            foreign.iter().filter_map(|p| p.used_memory_bytes).sum::<u64>(),
        );
        let mut by_unit: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
        for p in g.processes.iter().filter(|p| !p.foreign) {
            *by_unit.entry(p.unit.as_str()).or_default() += p.used_memory_bytes.unwrap_or(0);
        }
        for (unit, bytes) in by_unit {
            o.metric(
                "pdwarden_gpu_unit_memory_bytes",
                "gauge",
                "GPU memory held by a unit's processes (including a dead unit's leftovers).",
                &format!("{l},unit=\"{}\"", label(unit)),
                bytes,
            );
        }
    }
    for ((gpu, kind), n) in &latest.events_total {
        o.metric(
            "pdwarden_gpu_events_total",
            "counter",
            "Critical GPU events (Xid, ECC) since the agent started.",
            &format!("{h},gpu=\"{gpu}\",kind=\"{}\"", label(kind)),
            n,
        );
    }
    o.text
}

#[derive(Clone)]
struct Exporter {
    host: Arc<String>,
    latest: watch::Receiver<Arc<Latest>>,
}

async fn metrics(State(e): State<Exporter>) -> impl IntoResponse {
    let latest = Arc::clone(&e.latest.borrow());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        render(&e.host, &latest),
    )
}

/// Serves `/metrics` on `listener` until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, host: String, latest: watch::Receiver<Arc<Latest>>) {
    let app = Router::new().route("/metrics", get(metrics)).with_state(Exporter {
        host: Arc::new(host),
        latest,
    });
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!(error = %e, "metrics endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use pdwarden_proto::v1::{GpuDevice, GpuProcess, HostSnapshot, HostStats};

    use super::*;

    // Property: GPU, host, unit and event figures all appear, each family declared once,
    // with foreign memory counted apart from units'.
    #[test]
    fn renders_gpu_host_and_events() {
        let latest = Latest {
            snapshot: Some(HostSnapshot {
                gpu_source: "fake".into(),
                host: Some(HostStats {
                    cpu_count: 2,
                    memory_total_bytes: 8,
                    load1: 0.5,
                    ..Default::default()
                }),
                gpus: vec![GpuDevice {
                    index: 0,
                    uuid: "GPU-0".into(),
                    name: "Fake \"H100\"".into(),
                    memory_used_bytes: 30,
                    memory_total_bytes: 80,
                    utilization_gpu_pct: Some(0),
                    temperature_c: Some(41),
                    power_draw_mw: Some(70_500),
                    processes: vec![
                        GpuProcess {
                            pid: 1,
                            used_memory_bytes: Some(10),
                            unit: "prefill-0".into(),
                            ..Default::default()
                        },
                        GpuProcess {
                            pid: 2,
                            used_memory_bytes: Some(20),
                            foreign: true,
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            events_total: [((0, "xid".to_owned()), 2)].into(),
        };
        let t = render("gpu-1", &latest);
        for line in [
            "pdwarden_gpu_reporting_available{host=\"gpu-1\",source=\"fake\"} 1",
            "pdwarden_host_cpus{host=\"gpu-1\"} 2",
            "pdwarden_host_load_average{host=\"gpu-1\",window=\"1m\"} 0.5",
            "pdwarden_gpu_memory_used_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 30",
            "pdwarden_gpu_power_draw_watts{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 70.5",
            "pdwarden_gpu_foreign_memory_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 20",
            "pdwarden_gpu_unit_memory_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\",unit=\"prefill-0\"} 10",
            "pdwarden_gpu_events_total{host=\"gpu-1\",gpu=\"0\",kind=\"xid\"} 2",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line}\n{t}");
        }
        assert_eq!(t.matches("# TYPE pdwarden_host_load_average").count(), 1);
    }

    // Property: before the first sample the endpoint says GPU reporting is not available.
    #[test]
    fn empty_before_first_sample() {
        let t = render("h", &Latest::default());
        assert!(t.contains("pdwarden_gpu_reporting_available{host=\"h\"} 0"), "{t}");
    }
}
