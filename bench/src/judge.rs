//! The change gate's error rates, measured (issue 17): a Monte Carlo harness
//! over the pure judge, run through the gate's own procedure.
//!
//! Each trial synthesises the benchmark the gate runs at its defaults
//! (`GateConfig::default()`: prompts 16 and 512, 64 output tokens,
//! concurrency 1 and 4, 16 requests a look, up to 48 after the change) as
//! [`Measurement`]s, and runs the steps of the gate's machine (`gate::machine::Gating::step`) on them
//! through the same functions: `metrics`, `Measurement::extend`,
//! `imprecise_baseline` (more baseline while too loose), `judge` at every
//! look until a decision or the budget, and, when the change is not kept,
//! the baseline measured again and checked by `BaselineCheck` (a moved
//! baseline is not blamed on the knob). The numbers a gate meets in the
//! field are drawn from a model that is deliberately rough:
//! - every request's TTFT and inter-token latency vary by a log-normal
//!   factor with a 25 % coefficient of variation (issue 17's figure), or
//!   5 % for a quiet pair benchmarked with fixed prompts;
//! - at concurrency 4 the requests of one round also share a log-normal
//!   factor (10 %, or 2 % on the quiet pair): the batch and the host's moment;
//! - end-to-end = TTFT + 63 × ITL, throughput per round = tokens ÷ the
//!   round's slowest request.
//!
//! Scenarios change the "after" side (and, for drift, the baseline taken
//! again) by a factor on every latency, a tail, or a second mode.

use pdwarden_model::gate::config::GateConfig;
use pdwarden_model::gate::measure::{CellMeasurement, Measurement, RequestFigures, metrics};
use pdwarden_model::judge::gate::{self as judge, BaselineCheck, JudgePolicy, Judgement, SplitMix};

/// How the "after" side differs from the baseline.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    /// Every latency × the factor (throughput ÷ it).
    Shift(f64),
    /// With probability `p` a request is `factor` × slower; the rest unchanged.
    Tail { p: f64, factor: f64 },
    /// Both sides bimodal (30 % of requests 2.5× slower), no change.
    BimodalNoOp,
    /// The host slows by the factor from the change on, and stays slow for
    /// the baseline taken again: the knob itself does nothing.
    Drift(f64),
    /// The knob makes every latency `knob` × slower, and the pair after the
    /// rollback measures `again` × its first baseline (a restarted engine
    /// not yet as warm as the one first measured: issue 15's real decode).
    ColdRollback { knob: f64, again: f64 },
    /// No change, and one request of the first look after it fails (a
    /// stream error under client traffic: issue 47).
    OneTransientFailure,
    /// Each request after the change fails with this probability; the
    /// latencies are unchanged.
    Failing(f64),
}

pub struct Scenario {
    pub name: &'static str,
    pub change: Change,
    /// The per-request coefficient of variation of TTFT and ITL.
    pub cv: f64,
    /// What the target says about this scenario.
    pub target: Target,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// A regression at or beyond the tolerance: kept at most this often.
    KeptAtMost(f64),
    /// Nothing the knob did is worse: rejected at most this often.
    RejectedAtMost(f64),
    /// The knob is worse, whatever the rollback measures: rejected (blamed
    /// on the knob) at least this often.
    RejectedAtLeast(f64),
}

/// Issue 17's spread, and that of a pair benchmarked with fixed prompts on
/// a quiet host.
const NOISY: f64 = 0.25;
const QUIET: f64 = 0.05;

pub fn scenarios() -> Vec<Scenario> {
    use Change::*;
    use Target::*;
    vec![
        Scenario {
            name: "no-op, quiet pair (CV 5 %)",
            change: Shift(1.0),
            target: RejectedAtMost(0.05),
            cv: QUIET,
        },
        Scenario {
            name: "+10 % (at the tolerance), quiet pair (CV 5 %)",
            change: Shift(1.10),
            target: KeptAtMost(0.05),
            cv: QUIET,
        },
        Scenario {
            name: "+15 %, quiet pair (CV 5 %)",
            change: Shift(1.15),
            target: KeptAtMost(0.05),
            cv: QUIET,
        },
        Scenario {
            name: "no-op",
            change: Shift(1.0),
            target: RejectedAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "−15 % (faster)",
            change: Shift(0.85),
            target: RejectedAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "+10 % (at the tolerance)",
            change: Shift(1.10),
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "+15 %",
            change: Shift(1.15),
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "+25 %",
            change: Shift(1.25),
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "+50 %",
            change: Shift(1.5),
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "tail only (3 in 16 requests 3× slower)",
            change: Tail {
                p: 3.0 / 16.0,
                factor: 3.0,
            },
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "bimodal, no-op",
            change: BimodalNoOp,
            target: RejectedAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "drift +30 % (the host, not the knob)",
            change: Drift(1.3),
            target: RejectedAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "no-op, one transient failure after the change, quiet pair (CV 5 %)",
            change: OneTransientFailure,
            target: RejectedAtMost(0.05),
            cv: QUIET,
        },
        Scenario {
            name: "1 in 10 requests fails after the change",
            change: Failing(0.10),
            target: KeptAtMost(0.05),
            cv: NOISY,
        },
        Scenario {
            name: "2× slower, the rollback measured 25 % colder",
            change: ColdRollback { knob: 2.0, again: 1.25 },
            target: RejectedAtLeast(0.95),
            cv: NOISY,
        },
    ]
}

/// How one simulated gate ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Kept,
    Rejected,
    Inconclusive,
    BaselineMoved,
}

/// One scenario's rates over `trials` gates.
pub struct Row {
    pub name: &'static str,
    pub target: Target,
    pub trials: usize,
    pub kept: usize,
    pub rejected: usize,
    pub inconclusive: usize,
    pub baseline_moved: usize,
    /// Mean requests per cell the gate measured (baseline, after, rollback).
    pub mean_requests: f64,
}

impl Row {
    pub fn rate(&self, n: usize) -> f64 {
        n as f64 / self.trials.max(1) as f64
    }

    pub fn met(&self) -> bool {
        match self.target {
            Target::KeptAtMost(x) => self.rate(self.kept) <= x,
            Target::RejectedAtMost(x) => self.rate(self.rejected) <= x,
            Target::RejectedAtLeast(x) => self.rate(self.rejected) >= x,
        }
    }
}

fn lognormal(rng: &mut SplitMix, cv: f64) -> f64 {
    // σ² = ln(1 + cv²), mean 1.
    let sigma = (1.0 + cv * cv).ln().sqrt();
    let (u1, u2) = (rng.unit(), rng.unit());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (sigma * z - sigma * sigma / 2.0).exp()
}

/// Which side of the gate a measurement is of.
#[derive(Clone, Copy, PartialEq)]
enum Side {
    Baseline,
    After,
    BaselineAgain,
}

/// One look of the benchmark, as the agent would report it.
fn measure(cfg: &GateConfig, change: Change, cv: f64, side: Side, rng: &mut SplitMix) -> Measurement {
    let mut cells = Vec::new();
    for cell in cfg.cells() {
        let ttft0 = 20.0 + cell.prompt_tokens as f64 * 0.08;
        let itl0 = if cell.concurrency > 1 { 12.0 } else { 10.0 };
        let mut requests = Vec::new();
        let mut throughput = Vec::new();
        for round in 0..cell.rounds {
            // The round's shared factor: 10 % on the noisy host, 2 % on a quiet one.
            let shared = if cell.concurrency > 1 {
                lognormal(rng, (cv * 0.4).min(0.10))
            } else {
                1.0
            };
            let mut slowest: f64 = 0.0;
            let mut tokens = 0;
            for _ in 0..cell.concurrency {
                let mut f = shared;
                let bimodal = matches!(change, Change::BimodalNoOp) && rng.unit() < 0.3;
                if bimodal {
                    f *= 2.5;
                }
                match (change, side) {
                    (Change::Shift(x), Side::After) => f *= x,
                    (Change::Tail { p, factor }, Side::After) if rng.unit() < p => f *= factor,
                    (Change::Drift(x), Side::After | Side::BaselineAgain) => f *= x,
                    (Change::ColdRollback { knob, .. }, Side::After) => f *= knob,
                    (Change::ColdRollback { again, .. }, Side::BaselineAgain) => f *= again,
                    _ => {}
                }
                let ttft = ttft0 * f * lognormal(rng, cv);
                let itl = itl0 * f * lognormal(rng, cv);
                let e2e = ttft + itl * f64::from(cell.output_tokens - 1);
                slowest = slowest.max(e2e);
                tokens += cell.output_tokens;
                let ok = !matches!((change, side), (Change::Failing(p), Side::After) if rng.unit() < p);
                requests.push(RequestFigures {
                    round,
                    ok,
                    ttft_ms: ttft,
                    e2e_ms: e2e,
                    itl_ms: Some(itl),
                    tokens: cell.output_tokens,
                    error: String::new(),
                });
            }
            throughput.push(f64::from(tokens) / (slowest / 1000.0));
        }
        cells.push(CellMeasurement {
            cell,
            requests,
            throughput,
        });
    }
    Measurement {
        label: String::new(),
        cells,
        total_ms: 0,
        ..Measurement::default()
    }
}

fn requests(m: &Measurement) -> usize {
    m.cells.iter().map(|c| c.requests.len()).sum()
}

/// One gate, as its machine (`Gating::step`) decides it; returns the outcome and the
/// requests measured per cell.
fn one_gate(cfg: &GateConfig, policy: JudgePolicy, change: Change, cv: f64, seed: u64) -> (Outcome, f64) {
    let mut rng = SplitMix(seed);
    let looks = policy.max_looks;
    let mut baseline = measure(cfg, change, cv, Side::Baseline, &mut rng);
    for _ in 1..looks {
        if judge::imprecise_baseline(&metrics(&baseline, &baseline), policy).is_empty() {
            break;
        }
        baseline.extend(measure(cfg, change, cv, Side::Baseline, &mut rng));
    }
    let mut after = measure(cfg, change, cv, Side::After, &mut rng);
    if matches!(change, Change::OneTransientFailure)
        && let Some(r) = after.cells.first_mut().and_then(|c| c.requests.first_mut())
    {
        r.ok = false;
    }
    let mut look = 1;
    let report = loop {
        let r = judge::judge(
            &metrics(&baseline, &after),
            baseline.tally(),
            after.tally(),
            policy,
            look,
        );
        if r.judgement != Judgement::Inconclusive || look >= looks {
            break r;
        }
        look += 1;
        after.extend(measure(cfg, change, cv, Side::After, &mut rng));
    };
    let mut used = requests(&baseline) + requests(&after);
    let outcome = match report.judgement {
        Judgement::Improved | Judgement::NotWorse => Outcome::Kept,
        j => {
            // Rolled back: the baseline again, checked for equivalence.
            let rollback = JudgePolicy {
                tolerance_pct: cfg.rollback_tolerance_pct,
                ..policy
            };
            let mut again = measure(cfg, change, cv, Side::BaselineAgain, &mut rng);
            let mut look = 1;
            let check = loop {
                let c = BaselineCheck::of(&judge::judge(
                    &metrics(&baseline, &again),
                    baseline.tally(),
                    again.tally(),
                    rollback,
                    look,
                ));
                if c != BaselineCheck::NotShown || look >= looks {
                    break c;
                }
                look += 1;
                again.extend(measure(cfg, change, cv, Side::BaselineAgain, &mut rng));
            };
            used += requests(&again);
            // A–B–A′: a moved baseline excuses only a change not shown
            // worse than the pair after the rollback as well.
            let worse_than_both = || {
                let vs_again = judge::judge(&metrics(&again, &after), again.tally(), after.tally(), policy, 1);
                judge::WorseThanBoth::of(&report, &vs_again).shown()
            };
            match (check, j) {
                (BaselineCheck::Moved, Judgement::Regressed) if worse_than_both() => Outcome::Rejected,
                (BaselineCheck::Moved, _) => Outcome::BaselineMoved,
                (_, Judgement::Regressed) => Outcome::Rejected,
                _ => Outcome::Inconclusive,
            }
        }
    };
    (outcome, used as f64 / cfg.cells().len() as f64)
}

/// Runs every scenario `trials` times on the gate's defaults, on all cores.
pub fn run(trials: usize, seed: u64) -> Vec<Row> {
    let cfg = GateConfig::default();
    let policy = JudgePolicy {
        tolerance_pct: cfg.tolerance_pct,
        alpha: cfg.alpha,
        bootstrap_resamples: cfg.bootstrap_resamples,
        seed: 0x5eed_9a7e,
        min_effect_ms: cfg.min_effect_ms,
        min_effect_max_pct: cfg.min_effect_max_pct,
        max_looks: cfg.max_looks(),
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    scenarios()
        .into_iter()
        .enumerate()
        .map(|(s, sc)| {
            let results: Vec<(Outcome, f64)> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let cfg = &cfg;
                        scope.spawn(move || {
                            (t..trials)
                                .step_by(threads)
                                .map(|i| one_gate(cfg, policy, sc.change, sc.cv, seed ^ ((s as u64) << 32) ^ i as u64))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
            });
            let n = |o: Outcome| results.iter().filter(|r| r.0 == o).count();
            Row {
                name: sc.name,
                target: sc.target,
                trials: results.len(),
                kept: n(Outcome::Kept),
                rejected: n(Outcome::Rejected),
                inconclusive: n(Outcome::Inconclusive),
                baseline_moved: n(Outcome::BaselineMoved),
                mean_requests: results.iter().map(|r| r.1).sum::<f64>() / results.len().max(1) as f64,
            }
        })
        .collect()
}

/// The table, for people (and the README).
pub fn print(rows: &[Row]) {
    println!(
        "| scenario | kept | rejected | inconclusive (rolled back) | baseline moved | mean requests per cell | target |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let pct = |n: usize| format!("{:.1} %", 100.0 * r.rate(n));
        let met = if r.met() { "met" } else { "MISSED" };
        let target = match r.target {
            Target::KeptAtMost(x) => format!("kept ≤ {:.0} % → {met}", x * 100.0),
            Target::RejectedAtMost(x) => format!("rejected ≤ {:.0} % → {met}", x * 100.0),
            Target::RejectedAtLeast(x) => format!("rejected ≥ {:.0} % → {met}", x * 100.0),
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {target} |",
            r.name,
            pct(r.kept),
            pct(r.rejected),
            pct(r.inconclusive),
            pct(r.baseline_moved),
            r.mean_requests,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model's noise is what it claims: mean 1, CV 25 %.
    #[test]
    fn lognormal_has_the_asked_spread() {
        let mut rng = SplitMix(3);
        let v: Vec<f64> = (0..20_000).map(|_| lognormal(&mut rng, 0.25)).collect();
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!((m - 1.0).abs() < 0.01, "{m}");
        assert!((sd / m - 0.25).abs() < 0.01, "{}", sd / m);
    }

    /// A +50 % regression is found, and a measurement has the gate's shape.
    #[test]
    fn a_large_regression_is_rejected() {
        let cfg = GateConfig::default();
        let m = measure(&cfg, Change::Shift(1.0), NOISY, Side::Baseline, &mut SplitMix(1));
        assert_eq!(m.cells.len(), 4);
        assert_eq!(m.cells[1].requests.len(), 32, "8 rounds of 4");
        let policy = JudgePolicy {
            tolerance_pct: 5.0,
            alpha: 0.05,
            bootstrap_resamples: 300,
            seed: 1,
            min_effect_ms: 1.0,
            min_effect_max_pct: 25.0,
            max_looks: 3,
        };
        let (o, used) = one_gate(&cfg, policy, Change::Shift(1.5), NOISY, 9);
        assert_eq!(o, Outcome::Rejected);
        assert!(used >= 32.0, "{used}");
    }
}
