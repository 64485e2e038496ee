//! A small Prometheus endpoint (`GET /metrics`) for the GPU and host figures
//! of the latest snapshot, served when `metrics_listen` is set.
//!
//! It only renders what the reporter already sampled (no reading on
//! scrape), so a scrape costs nothing and never blocks on NVML. The text is
//! written by `prometheus-client`, served as the classic text format
//! ([`pdwarden_proto::exposition`]); each scrape builds a fresh registry from the snapshot, so a GPU or
//! unit that went away leaves no stale series behind. [`render`] is pure and
//! unit-tested; its names pass `promtool check metrics` (a test).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::gpu::reporter::Latest;

type Labels = Vec<(String, String)>;

/// The families of one scrape, registered on first use.
struct Out {
    registry: Registry,
    gauges: BTreeMap<&'static str, Family<Labels, Gauge<f64, AtomicU64>>>,
    counters: BTreeMap<&'static str, Family<Labels, Counter>>,
}

impl Out {
    fn gauge(&mut self, name: &'static str, help: &str, labels: &Labels, value: f64) {
        let Out { registry, gauges, .. } = self;
        family(registry, gauges, name, help).get_or_create(labels).set(value);
    }

    /// `name` without `_total`: the encoder appends it.
    fn counter(&mut self, name: &'static str, help: &str, labels: &Labels, value: u64) {
        let Out { registry, counters, .. } = self;
        family(registry, counters, name, help)
            .get_or_create(labels)
            .inc_by(value);
    }

    fn text(self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        pdwarden_proto::exposition::prometheus_text(&out)
    }
}

/// The family `name` of one kind of metric, registered on first use.
fn family<'a, M>(
    registry: &mut Registry,
    families: &'a mut BTreeMap<&'static str, Family<Labels, M>>,
    name: &'static str,
    help: &str,
) -> &'a Family<Labels, M>
where
    M: prometheus_client::metrics::TypedMetric
        + prometheus_client::encoding::EncodeMetric
        + Default
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    families.entry(name).or_insert_with(|| {
        let f = Family::default();
        registry.register(name, help, f.clone());
        f
    })
}

/// `base` and more labels.
fn with(base: &Labels, more: &[(&str, String)]) -> Labels {
    let mut l = base.clone();
    l.extend(more.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    l
}

/// The exposition text for `latest` on `host`.
pub fn render(host: &str, latest: &Latest) -> String {
    let mut o = Out {
        registry: Registry::default(),
        gauges: BTreeMap::new(),
        counters: BTreeMap::new(),
    };
    let h: Labels = vec![("host".into(), host.to_string())];
    const REPORTING: &str = "1 when the GPU source reads GPUs, 0 when GPU reporting is off or failing";
    let Some(s) = &latest.snapshot else {
        o.gauge("pdwarden_gpu_reporting_available", REPORTING, &h, 0.0);
        return o.text();
    };
    o.gauge(
        "pdwarden_gpu_reporting_available",
        REPORTING,
        &with(&h, &[("source", s.gpu_source.clone())]),
        f64::from(u8::from(s.gpu_unavailable.is_empty())),
    );
    if let Some(x) = &s.host {
        o.gauge(
            "pdwarden_host_cpu_usage_ratio",
            "Host CPU usage, all CPUs together (0-1)",
            &h,
            f64::from(x.cpu_pct) / 100.0,
        );
        o.gauge("pdwarden_host_cpus", "Logical CPUs", &h, f64::from(x.cpu_count));
        o.gauge(
            "pdwarden_host_memory_used_bytes",
            "Host memory in use",
            &h,
            x.memory_used_bytes as f64,
        );
        o.gauge(
            "pdwarden_host_memory_total_bytes",
            "Host memory installed",
            &h,
            x.memory_total_bytes as f64,
        );
        for (window, v) in [("1m", x.load1), ("5m", x.load5), ("15m", x.load15)] {
            o.gauge(
                "pdwarden_host_load_average",
                "Load average",
                &with(&h, &[("window", window.into())]),
                v,
            );
        }
    }
    for u in &s.units {
        let l = with(&h, &[("unit", u.unit.clone())]);
        o.gauge(
            "pdwarden_unit_rss_bytes",
            "Resident memory of a unit's process tree",
            &l,
            u.rss_bytes as f64,
        );
        o.gauge(
            "pdwarden_unit_cpu_usage_ratio",
            "CPU of a unit's process tree (1 = one CPU)",
            &l,
            f64::from(u.cpu_pct) / 100.0,
        );
        o.gauge(
            "pdwarden_unit_processes",
            "Processes in a unit's tree (0 when not running)",
            &l,
            f64::from(u.processes),
        );
    }
    for g in &s.gpus {
        let l = with(
            &h,
            &[
                ("gpu", g.index.to_string()),
                ("uuid", g.uuid.clone()),
                ("name", g.name.clone()),
            ],
        );
        o.gauge(
            "pdwarden_gpu_memory_used_bytes",
            "GPU memory in use",
            &l,
            g.memory_used_bytes as f64,
        );
        o.gauge(
            "pdwarden_gpu_memory_total_bytes",
            "GPU memory installed",
            &l,
            g.memory_total_bytes as f64,
        );
        if let Some(v) = g.utilization_gpu_pct {
            o.gauge(
                "pdwarden_gpu_utilization_ratio",
                "Share of the driver's sample period a kernel was running (0-1)",
                &l,
                f64::from(v) / 100.0,
            );
        }
        if let Some(v) = g.utilization_memory_pct {
            o.gauge(
                "pdwarden_gpu_memory_utilization_ratio",
                "Share of the driver's sample period device memory was read or written (0-1)",
                &l,
                f64::from(v) / 100.0,
            );
        }
        if let Some(v) = g.temperature_c {
            o.gauge(
                "pdwarden_gpu_temperature_celsius",
                "GPU die temperature",
                &l,
                f64::from(v),
            );
        }
        if let Some(v) = g.power_draw_mw {
            o.gauge("pdwarden_gpu_power_draw_watts", "Power draw", &l, f64::from(v) / 1000.0);
        }
        if let Some(v) = g.power_limit_mw {
            o.gauge(
                "pdwarden_gpu_power_limit_watts",
                "Enforced power limit",
                &l,
                f64::from(v) / 1000.0,
            );
        }
        o.gauge(
            "pdwarden_gpu_throttled",
            "1 while any clock throttle reason other than idle is active",
            &l,
            f64::from(u8::from(!g.throttle_reasons.is_empty())),
        );
        if let Some(e) = &g.ecc {
            for (counter, kind, v) in [
                ("volatile", "corrected", e.volatile_corrected),
                ("volatile", "uncorrected", e.volatile_uncorrected),
                ("aggregate", "corrected", e.aggregate_corrected),
                ("aggregate", "uncorrected", e.aggregate_uncorrected),
            ] {
                o.gauge(
                    "pdwarden_gpu_ecc_errors",
                    "ECC error counts as the driver keeps them (volatile: since driver load)",
                    &with(&l, &[("counter", counter.into()), ("type", kind.into())]),
                    v as f64,
                );
            }
        }
        if let Some(v) = g.retired_pages {
            o.gauge("pdwarden_gpu_retired_pages", "Retired memory pages", &l, f64::from(v));
        }
        if let Some(r) = &g.remapped_rows {
            for (cause, v) in [("correctable", r.correctable), ("uncorrectable", r.uncorrectable)] {
                o.gauge(
                    "pdwarden_gpu_remapped_rows",
                    "Memory rows remapped, by the kind of error that caused it",
                    &with(&l, &[("cause", cause.into())]),
                    f64::from(v),
                );
            }
            o.gauge(
                "pdwarden_gpu_row_remap_pending",
                "1 while a row remapping waits for a GPU reset",
                &l,
                f64::from(u8::from(r.pending)),
            );
            o.gauge(
                "pdwarden_gpu_row_remap_failed",
                "1 if a row remapping failed (the GPU needs service)",
                &l,
                f64::from(u8::from(r.failure)),
            );
        }
        let foreign: Vec<_> = g.processes.iter().filter(|p| p.foreign).collect();
        o.gauge(
            "pdwarden_gpu_foreign_processes",
            "Processes on the GPU that no supervised unit owns",
            &l,
            foreign.len() as f64,
        );
        o.gauge(
            "pdwarden_gpu_foreign_memory_bytes",
            "GPU memory held by processes no supervised unit owns",
            &l,
            foreign.iter().filter_map(|p| p.used_memory_bytes).sum::<u64>() as f64,
        );
        let mut by_unit: BTreeMap<&str, u64> = BTreeMap::new();
        for p in g.processes.iter().filter(|p| !p.foreign) {
            *by_unit.entry(p.unit.as_str()).or_default() += p.used_memory_bytes.unwrap_or(0);
        }
        for (unit, bytes) in by_unit {
            o.gauge(
                "pdwarden_gpu_unit_memory_bytes",
                "GPU memory held by a unit's processes (including a dead unit's leftovers)",
                &with(&l, &[("unit", unit.to_string())]),
                bytes as f64,
            );
        }
    }
    for ((gpu, kind), n) in &latest.events_total {
        o.counter(
            "pdwarden_gpu_events",
            "Critical GPU events (Xid, ECC) since the agent started",
            &with(&h, &[("gpu", gpu.to_string()), ("kind", kind.clone())]),
            *n,
        );
    }
    o.text()
}

#[derive(Clone)]
struct Exporter {
    host: Arc<String>,
    latest: watch::Receiver<Arc<Latest>>,
}

async fn metrics(State(e): State<Exporter>) -> impl IntoResponse {
    let latest = Arc::clone(&e.latest.borrow());
    (
        [(header::CONTENT_TYPE, pdwarden_proto::exposition::CONTENT_TYPE)],
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

    /// Issue 18: the exposition passes `promtool check metrics` (names,
    /// units, types, help), GPUs, ECC, row remaps and events included.
    #[test]
    fn promtool_accepts_the_exposition() {
        let latest = Latest {
            snapshot: Some(HostSnapshot {
                gpu_source: "fake".into(),
                host: Some(HostStats {
                    cpu_count: 2,
                    memory_total_bytes: 8,
                    load1: 0.5,
                    ..Default::default()
                }),
                units: vec![Default::default()],
                gpus: vec![GpuDevice {
                    utilization_gpu_pct: Some(50),
                    utilization_memory_pct: Some(5),
                    temperature_c: Some(41),
                    power_draw_mw: Some(70_500),
                    power_limit_mw: Some(700_000),
                    ecc: Some(Default::default()),
                    retired_pages: Some(0),
                    remapped_rows: Some(Default::default()),
                    processes: vec![GpuProcess {
                        pid: 1,
                        used_memory_bytes: Some(10),
                        unit: "prefill-0".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            events_total: [((0, "xid".to_owned()), 2)].into(),
            ..Default::default()
        };
        let t = render("gpu-1", &latest);
        let check = pdwarden_proto::exposition::promtool_check;
        assert_eq!(check(&t), Ok(()), "{t}");
        assert_eq!(check(&render("h", &Latest::default())), Ok(()));
    }

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
            ..Default::default()
        };
        let t = render("gpu-1", &latest);
        for line in [
            "pdwarden_gpu_reporting_available{host=\"gpu-1\",source=\"fake\"} 1.0",
            "pdwarden_host_cpus{host=\"gpu-1\"} 2.0",
            "pdwarden_host_load_average{host=\"gpu-1\",window=\"1m\"} 0.5",
            "pdwarden_gpu_memory_used_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 30.0",
            "pdwarden_gpu_power_draw_watts{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 70.5",
            "pdwarden_gpu_utilization_ratio{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 0.0",
            "pdwarden_gpu_foreign_memory_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\"} 20.0",
            "pdwarden_gpu_unit_memory_bytes{host=\"gpu-1\",gpu=\"0\",uuid=\"GPU-0\",name=\"Fake \\\"H100\\\"\",unit=\"prefill-0\"} 10.0",
            "# TYPE pdwarden_gpu_events_total counter",
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
        assert!(t.contains("pdwarden_gpu_reporting_available{host=\"h\"} 0.0"), "{t}");
    }
}
