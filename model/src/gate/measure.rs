//! The gate's benchmark as data: the requests of each cell of each look,
//! and how two measurements pair up into the judge's metrics. The same
//! benchmark runs before the change, after it and after a rollback, and
//! every one is journaled whole: the judge's numbers can be recomputed from
//! the journal, and a gate taken over after a restart holds its rollback to
//! the baseline the killed orchestrator measured.

use std::collections::BTreeMap;

use pdwarden_proto::v1::{GateBenchmarkResult, ProbeOutcome};
use serde::{Deserialize, Serialize};

use super::config::Cell;
use crate::judge::gate::{Better, MetricSamples};

/// One benchmark request, as kept for the judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFigures {
    pub round: u32,
    pub ok: bool,
    pub ttft_ms: f64,
    pub e2e_ms: f64,
    /// Mean inter-token latency (first to last token / (tokens − 1)).
    pub itl_ms: Option<f64>,
    pub tokens: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One cell of one measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellMeasurement {
    pub cell: Cell,
    pub requests: Vec<RequestFigures>,
    /// Tokens per second of each round.
    pub throughput: Vec<f64>,
}

/// One run of the benchmark (baseline, after, rollback).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub label: String,
    pub cells: Vec<CellMeasurement>,
    pub total_ms: u64,
    /// The discarded warm-up before it (absent from a measurement journaled
    /// before issue 47).
    #[serde(default, skip_serializing_if = "WarmUp::is_empty")]
    pub warmup: WarmUp,
}

/// The warm-up the gate runs before every look and whose timings it
/// discards (the pair just restarted is not yet warm; the pair in service
/// is). A request that failed there still failed: it counts in the look's
/// failures (issue 47: the warm-up threw its failures away with its
/// timings, so a transient, or a change that fails its first requests,
/// never reached the judge).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmUp {
    pub requests: usize,
    pub failed: usize,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub first_error: String,
}

impl WarmUp {
    /// The warm-up of `cells` as measured.
    pub fn of(cells: &[CellMeasurement]) -> WarmUp {
        let all = || cells.iter().flat_map(|c| &c.requests);
        WarmUp {
            requests: all().count(),
            failed: all().filter(|r| !r.ok).count(),
            first_error: all().find(|r| !r.ok).map(|r| r.error.clone()).unwrap_or_default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.requests == 0 && self.failed == 0
    }
}

impl Measurement {
    /// The requests that failed, the warm-up's included.
    pub fn failures(&self) -> usize {
        self.cells.iter().flat_map(|c| &c.requests).filter(|r| !r.ok).count() + self.warmup.failed
    }

    /// The requests sent and those that failed, the warm-up's included,
    /// for the judge's rate test.
    pub fn tally(&self) -> crate::judge::gate::Tally {
        let sent = self.cells.iter().map(|c| c.requests.len()).sum::<usize>() + self.warmup.requests;
        crate::judge::gate::Tally::new(self.failures(), sent)
    }

    /// The completed requests' values, grouped by round (rounds with none
    /// left out).
    fn ok_values(c: &CellMeasurement, f: impl Fn(&RequestFigures) -> Option<f64>) -> Vec<Vec<f64>> {
        let mut by_round: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        for r in c.requests.iter().filter(|r| r.ok) {
            if let Some(v) = f(r) {
                by_round.entry(r.round).or_default().push(v);
            }
        }
        by_round.into_values().collect()
    }

    /// Adds another look's requests: rounds are renumbered after this
    /// measurement's, so each stays its own sampling unit.
    pub fn extend(&mut self, more: Measurement) {
        for m in more.cells {
            match self.cells.iter_mut().find(|c| c.cell == m.cell) {
                Some(c) => {
                    let offset = c.requests.iter().map(|r| r.round + 1).max().unwrap_or(0);
                    c.requests.extend(m.requests.into_iter().map(|mut r| {
                        r.round += offset;
                        r
                    }));
                    c.throughput.extend(m.throughput);
                }
                None => self.cells.push(m),
            }
        }
        self.total_ms += more.total_ms;
        self.warmup.requests += more.warmup.requests;
        self.warmup.failed += more.warmup.failed;
        if self.warmup.first_error.is_empty() {
            self.warmup.first_error = more.warmup.first_error;
        }
    }
}

/// Pairs the cells of two measurements into the judge's metrics.
pub fn metrics(before: &Measurement, after: &Measurement) -> Vec<MetricSamples> {
    let mut out = Vec::new();
    for b in &before.cells {
        let Some(a) = after.cells.iter().find(|c| c.cell == b.cell) else {
            continue;
        };
        let label = b.cell.label();
        let m = |metric: &str, unit: &str, better, before, after| MetricSamples {
            metric: metric.into(),
            cell: label.clone(),
            unit: unit.into(),
            better,
            before,
            after,
        };
        out.push(m(
            "ttft",
            "ms",
            Better::Lower,
            Measurement::ok_values(b, |r| Some(r.ttft_ms)),
            Measurement::ok_values(a, |r| Some(r.ttft_ms)),
        ));
        if b.cell.output_tokens >= 2 {
            out.push(m(
                "itl",
                "ms",
                Better::Lower,
                Measurement::ok_values(b, |r| r.itl_ms),
                Measurement::ok_values(a, |r| r.itl_ms),
            ));
        }
        out.push(m(
            "e2e",
            "ms",
            Better::Lower,
            Measurement::ok_values(b, |r| Some(r.e2e_ms)),
            Measurement::ok_values(a, |r| Some(r.e2e_ms)),
        ));
        // One value per round: the round is the sample.
        let rounds = |t: &[f64]| t.iter().map(|&x| vec![x]).collect::<Vec<_>>();
        out.push(m(
            "throughput",
            "tok/s",
            Better::Higher,
            rounds(&b.throughput),
            rounds(&a.throughput),
        ));
    }
    out
}

/// The first failed request's error (what a person reads first).
pub fn first_error(m: &Measurement) -> String {
    m.cells
        .iter()
        .flat_map(|c| &c.requests)
        .find(|r| !r.ok)
        .map(|r| r.error.clone())
        .unwrap_or_else(|| m.warmup.first_error.clone())
}

impl CellMeasurement {
    /// What the agent measured of `cell`: each request's figures, and each
    /// round's throughput (the completed requests' tokens over the round's
    /// time).
    pub fn of(cell: Cell, b: &GateBenchmarkResult) -> CellMeasurement {
        let requests: Vec<RequestFigures> = b
            .samples
            .iter()
            .map(|s| {
                let ok = s.outcome == ProbeOutcome::Ok as i32;
                RequestFigures {
                    round: s.round,
                    ok,
                    ttft_ms: s.ttft_us as f64 / 1000.0,
                    e2e_ms: s.latency_us as f64 / 1000.0,
                    itl_ms: (ok && s.tokens >= 2).then(|| s.decode_us as f64 / 1000.0 / f64::from(s.tokens - 1)),
                    tokens: s.tokens,
                    error: s.error.clone(),
                }
            })
            .collect();
        let throughput = b
            .round_us
            .iter()
            .enumerate()
            .map(|(round, &us)| {
                let tokens: u32 = requests
                    .iter()
                    .filter(|r| r.ok && r.round == round as u32)
                    .map(|r| r.tokens)
                    .sum();
                f64::from(tokens) / (us.max(1) as f64 / 1e6)
            })
            .collect();
        CellMeasurement {
            cell,
            requests,
            throughput,
        }
    }

    /// A cell the agent could not measure: one failed request saying why.
    pub fn failed(cell: Cell, error: String) -> CellMeasurement {
        CellMeasurement {
            cell,
            requests: vec![RequestFigures {
                round: 0,
                ok: false,
                ttft_ms: 0.0,
                e2e_ms: 0.0,
                itl_ms: None,
                tokens: 0,
                error,
            }],
            throughput: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ok: bool, error: &str) -> RequestFigures {
        RequestFigures {
            round: 0,
            ok,
            ttft_ms: 10.0,
            e2e_ms: 20.0,
            itl_ms: Some(1.0),
            tokens: 8,
            error: error.into(),
        }
    }

    /// Issue 47: the warm-up's timings are discarded, its failures are not.
    /// The gate's first request after a change is a warm-up request; a
    /// stream error there (a client's transient, or a change that fails its
    /// first requests) used to vanish with the warm-up's timings.
    #[test]
    fn a_failure_in_the_warm_up_counts() {
        let cell = Cell {
            prompt_tokens: 16,
            output_tokens: 24,
            concurrency: 1,
            rounds: 2,
        };
        let warmed = [CellMeasurement {
            cell,
            requests: vec![
                request(false, "error event in the stream after 2 tokens"),
                request(true, ""),
            ],
            throughput: Vec::new(),
        }];
        let mut m = Measurement {
            label: "after#1".into(),
            cells: vec![CellMeasurement {
                cell,
                requests: vec![request(true, ""); 16],
                throughput: Vec::new(),
            }],
            total_ms: 1,
            warmup: WarmUp::of(&warmed),
        };
        assert_eq!(m.failures(), 1);
        assert_eq!(m.tally(), crate::judge::gate::Tally::new(1, 18));
        assert_eq!(first_error(&m), "error event in the stream after 2 tokens");
        let again = m.clone();
        m.extend(again);
        assert_eq!(m.tally(), crate::judge::gate::Tally::new(2, 36));
    }
}
