//! The change gate's judgement: did a change make the pair better, worse,
//! or nothing we can tell apart from noise?
//!
//! Seeds argued about a knob's effect instead of measuring it. Here every
//! metric (TTFT, inter-token latency, end-to-end latency, throughput, per
//! benchmark cell) gets, from the samples before and after the change:
//! - its shape first ([`crate::stats::summarize`]): a bimodal set has no
//!   honest median, so its centre is compared by the **mean** and the report
//!   says why;
//! - the relative change of the centre (p50, or the mean) and of p90, each
//!   with a **bootstrap** percentile confidence interval (seeded: the same
//!   samples always give the same interval);
//! - a **Mann–Whitney U** test (normal approximation, tie-corrected) of
//!   "the two sets come from the same distribution", with Holm's correction
//!   over all the tests of one gate, since a gate runs many and one of twenty
//!   comes out "significant" by chance at 5 %.
//!
//! A difference counts only when the corrected test rejects *and* the
//! interval excludes zero. Only then is it a win or a regression; otherwise it
//! is reported as "no significant difference", never as a win. A
//! regression beyond the tolerance rejects the change. Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};

use crate::stats::{LatencySummary, summarize};

/// Which way is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Lower,
    Higher,
}

/// The samples of one metric in one benchmark cell, before and after.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSamples {
    /// "ttft", "itl", "e2e", "throughput".
    pub metric: String,
    /// "prompt 16 / output 24 / concurrency 4".
    pub cell: String,
    /// "ms" or "tok/s".
    pub unit: String,
    pub better: Better,
    pub before: Vec<f64>,
    pub after: Vec<f64>,
}

/// How strict the judge is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JudgePolicy {
    /// A significant change for the worse beyond this (percent) rejects.
    pub tolerance_pct: f64,
    /// Significance level of the (Holm-corrected) tests and 1 − the
    /// confidence level of the intervals.
    pub alpha: f64,
    pub bootstrap_resamples: u32,
    pub seed: u64,
    /// A latency change (unit "ms") smaller than this many milliseconds is
    /// never a regression, however significant: timer and scheduler noise on
    /// a busy host is that large, and a run-to-run drift of a millisecond is
    /// not what an operator rolls a change back for.
    pub min_effect_ms: f64,
}

/// What one comparison concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    NoSignificantDifference,
    Better,
    /// Worse, significantly, but within the tolerance.
    WorseWithinTolerance,
    /// Worse, significantly, beyond the tolerance.
    Regression,
    /// Significant, but a latency change smaller than `min_effect_ms`: no
    /// difference that matters, in either direction (neither a win nor a
    /// regression).
    UnderFloor,
    /// Better, significantly, but by less than the tolerance: as a worsening
    /// within the tolerance is not a regression, an improvement within it is
    /// not a win (a no-op knob measured on fresh processes drifted +2.8 %
    /// in throughput with a tight interval).
    BetterWithinTolerance,
}

/// The shape of one sample set, in the metric's unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum Shape {
    Empty,
    Unimodal {
        n: usize,
        median: f64,
    },
    /// Two modes: (count, median) of each; no single median is quoted.
    Bimodal {
        low: (usize, f64),
        high: (usize, f64),
    },
}

/// One statistic of one metric, compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub metric: String,
    pub cell: String,
    /// "p50", "mean" (when either side is bimodal) or "p90".
    pub statistic: String,
    pub unit: String,
    pub better: Better,
    pub before_shape: Shape,
    pub after_shape: Shape,
    pub before: f64,
    pub after: f64,
    /// (after − before) / before, percent.
    pub change_pct: f64,
    /// Bootstrap confidence interval of `change_pct`.
    pub ci_low_pct: f64,
    pub ci_high_pct: f64,
    /// Mann–Whitney two-sided p, and after Holm's correction.
    pub p_value: f64,
    pub p_adjusted: f64,
    pub finding: Finding,
}

/// The gate's overall conclusion from the measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// Something significantly better, nothing regressed beyond tolerance.
    Improved,
    /// Nothing measurably different: the change is kept (nothing regressed)
    /// but there is no evidence it helps.
    NoSignificantDifference,
    /// Only differences for the worse, all within the tolerance.
    WorseWithinTolerance,
    /// A regression beyond the tolerance, or requests that failed.
    Regressed,
}

/// The judge's answer: the conclusion, every comparison, and the lines a
/// person reads first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeReport {
    pub judgement: Judgement,
    pub comparisons: Vec<Comparison>,
    pub failures_before: usize,
    pub failures_after: usize,
    pub reasons: Vec<String>,
}

// ------------------------------------------------------------------ statistics

/// Linear-interpolation quantile of sorted data (q in 0..=1).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The result of a Mann–Whitney U test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample.
    pub u: f64,
    pub z: f64,
    /// Two-sided p (normal approximation with tie and continuity correction).
    pub p: f64,
}

/// Mann–Whitney U test of `a` against `b`. Needs no distribution shape;
/// the normal approximation is adequate from about 8 samples a side.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> MannWhitney {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return MannWhitney { u: 0.0, z: 0.0, p: 1.0 };
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    // Midranks for ties; tie correction term Σ(t³ − t).
    let mut rank_sum_a = 0.0;
    let mut ties = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let midrank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_a += all[i..=j].iter().filter(|x| x.1).count() as f64 * midrank;
        ties += t * t * t - t;
        i = j + 1;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let n = n1 + n2;
    let mu = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if var <= 0.0 {
        // Every value equal: no evidence of any difference.
        return MannWhitney { u, z: 0.0, p: 1.0 };
    }
    let d = u - mu;
    let z = (d.abs() - 0.5).max(0.0) / var.sqrt() * d.signum();
    MannWhitney {
        u,
        z,
        p: (2.0 * normal_sf(z.abs())).min(1.0),
    }
}

/// Upper tail of the standard normal, P(Z > z) (erfc, Numerical Recipes'
/// Chebyshev fit: relative error below 1.2e-7).
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Holm–Bonferroni adjusted p-values, in the input order.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut idx: Vec<usize> = (0..m).collect();
    idx.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut out = vec![1.0; m];
    let mut running: f64 = 0.0;
    for (k, &i) in idx.iter().enumerate() {
        running = running.max(((m - k) as f64 * p[i]).min(1.0));
        out[i] = running;
    }
    out
}

/// A small, seeded generator (SplitMix64): reproducible bootstrap intervals
/// without a dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Percentile-bootstrap interval (level 1 − alpha) of the relative change,
/// in percent, of `stat` from `a` to `b`: both sets are resampled with
/// replacement, independently.
pub fn bootstrap_change_ci(
    a: &[f64],
    b: &[f64],
    stat: impl Fn(&[f64]) -> f64,
    resamples: u32,
    alpha: f64,
    seed: u64,
) -> (f64, f64) {
    if a.is_empty() || b.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut rng = SplitMix(seed);
    let mut changes = Vec::with_capacity(resamples as usize);
    let (mut ra, mut rb) = (vec![0.0; a.len()], vec![0.0; b.len()]);
    for _ in 0..resamples.max(1) {
        for x in ra.iter_mut() {
            *x = a[rng.below(a.len())];
        }
        for x in rb.iter_mut() {
            *x = b[rng.below(b.len())];
        }
        let (sa, sb) = (stat(&ra), stat(&rb));
        if sa.abs() > f64::EPSILON {
            changes.push((sb - sa) / sa * 100.0);
        }
    }
    let s = sorted(&changes);
    (quantile(&s, alpha / 2.0), quantile(&s, 1.0 - alpha / 2.0))
}

/// The shape of a set (bimodality test of [`crate::stats`], on values
/// scaled to thousandths so that sub-millisecond differences count).
pub fn shape(v: &[f64]) -> Shape {
    let scaled: Vec<u64> = v.iter().map(|x| (x.max(0.0) * 1000.0).round() as u64).collect();
    match summarize(&scaled) {
        LatencySummary::Empty => Shape::Empty,
        LatencySummary::Unimodal { count, .. } => Shape::Unimodal {
            n: count,
            median: quantile(&sorted(v), 0.5),
        },
        LatencySummary::Bimodal { low, high } => Shape::Bimodal {
            low: (low.count, low.median_ms as f64 / 1000.0),
            high: (high.count, high.median_ms as f64 / 1000.0),
        },
    }
}

// --------------------------------------------------------------------- judge

fn median_of(v: &[f64]) -> f64 {
    quantile(&sorted(v), 0.5)
}
fn p90_of(v: &[f64]) -> f64 {
    quantile(&sorted(v), 0.9)
}

/// Compares every metric and concludes. `failures_*` are the benchmark
/// requests that did not complete, before and after.
pub fn judge(
    metrics: &[MetricSamples],
    failures_before: usize,
    failures_after: usize,
    policy: JudgePolicy,
) -> JudgeReport {
    let raw_p: Vec<f64> = metrics.iter().map(|m| mann_whitney(&m.before, &m.after).p).collect();
    let adjusted = holm(&raw_p);
    let mut comparisons = Vec::new();
    for (k, m) in metrics.iter().enumerate() {
        let (before_shape, after_shape) = (shape(&m.before), shape(&m.after));
        let bimodal = matches!(before_shape, Shape::Bimodal { .. }) || matches!(after_shape, Shape::Bimodal { .. });
        let centre: (&str, fn(&[f64]) -> f64) = if bimodal { ("mean", mean) } else { ("p50", median_of) };
        for (i, (statistic, stat)) in [centre, ("p90", p90_of as fn(&[f64]) -> f64)].into_iter().enumerate() {
            if m.before.is_empty() || m.after.is_empty() {
                continue;
            }
            let (before, after) = (stat(&m.before), stat(&m.after));
            let change_pct = if before.abs() > f64::EPSILON {
                (after - before) / before * 100.0
            } else {
                0.0
            };
            let seed = policy.seed ^ ((k as u64) << 8 | i as u64);
            let (lo, hi) = bootstrap_change_ci(
                &m.before,
                &m.after,
                stat,
                policy.bootstrap_resamples,
                policy.alpha,
                seed,
            );
            let significant = adjusted[k] < policy.alpha && (lo > 0.0 || hi < 0.0);
            let worse = match m.better {
                Better::Lower => change_pct > 0.0,
                Better::Higher => change_pct < 0.0,
            };
            let finding = if !significant {
                Finding::NoSignificantDifference
            } else if m.unit == "ms" && (after - before).abs() < policy.min_effect_ms {
                Finding::UnderFloor
            } else if !worse && change_pct.abs() <= policy.tolerance_pct {
                Finding::BetterWithinTolerance
            } else if !worse {
                Finding::Better
            } else if change_pct.abs() > policy.tolerance_pct {
                Finding::Regression
            } else {
                Finding::WorseWithinTolerance
            };
            comparisons.push(Comparison {
                metric: m.metric.clone(),
                cell: m.cell.clone(),
                statistic: statistic.into(),
                unit: m.unit.clone(),
                better: m.better,
                before_shape: before_shape.clone(),
                after_shape: after_shape.clone(),
                before,
                after,
                change_pct,
                ci_low_pct: lo,
                ci_high_pct: hi,
                p_value: raw_p[k],
                p_adjusted: adjusted[k],
                finding,
            });
        }
    }
    let count = |f: Finding| comparisons.iter().filter(|c| c.finding == f).count();
    let failed_more = failures_after > failures_before;
    let judgement = if failed_more || count(Finding::Regression) > 0 {
        Judgement::Regressed
    } else if count(Finding::Better) > 0 {
        Judgement::Improved
    } else if count(Finding::WorseWithinTolerance) > 0 {
        Judgement::WorseWithinTolerance
    } else {
        Judgement::NoSignificantDifference
    };
    let mut reasons = Vec::new();
    if failed_more {
        reasons.push(format!(
            "{failures_after} benchmark requests failed after the change ({failures_before} before)"
        ));
    }
    // Within each kind of finding, the largest changes first.
    if judgement == Judgement::NoSignificantDifference {
        let n = comparisons.len();
        let widest = comparisons
            .iter()
            .filter(|c| c.finding == Finding::NoSignificantDifference)
            .map(|c| c.ci_low_pct.abs().max(c.ci_high_pct.abs()))
            .fold(0.0, f64::max);
        let under = count(Finding::UnderFloor) + count(Finding::BetterWithinTolerance);
        reasons.push(if under == 0 {
            format!(
                "no significant difference in any of {n} comparisons (the changes were within the noise; intervals up to ±{widest:.1} %): not a win"
            )
        } else {
            format!(
                "no difference that matters in any of {n} comparisons ({under} significant but under the {} ms min_effect_ms floor or better by less than the {} % tolerance, the rest within the noise, intervals up to ±{widest:.1} %): not a win",
                policy.min_effect_ms, policy.tolerance_pct
            )
        });
    }
    for f in [
        Finding::Regression,
        Finding::WorseWithinTolerance,
        Finding::Better,
        Finding::BetterWithinTolerance,
        Finding::UnderFloor,
    ] {
        let mut found: Vec<&Comparison> = comparisons.iter().filter(|c| c.finding == f).collect();
        found.sort_by(|a, b| b.change_pct.abs().total_cmp(&a.change_pct.abs()));
        reasons.extend(found.into_iter().map(|c| describe(c, policy.tolerance_pct)));
    }
    JudgeReport {
        judgement,
        comparisons,
        failures_before,
        failures_after,
        reasons,
    }
}

fn fmt_value(v: f64, unit: &str) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// One line for people: "e2e p50 (prompt 16 / …): 41.20 ms → 49.31 ms,
/// +19.7 % [95 % CI +15.2, +24.0], p=0.0001 (Holm) — regression beyond 5 %".
pub fn describe(c: &Comparison, tolerance_pct: f64) -> String {
    let verdict = match c.finding {
        Finding::NoSignificantDifference => "no significant difference".to_string(),
        Finding::Better => "better".to_string(),
        Finding::UnderFloor => format!(
            "significant, but {:.2} {} is under the min_effect_ms floor: no difference that matters",
            (c.after - c.before).abs(),
            c.unit
        ),
        Finding::WorseWithinTolerance => format!("worse, within the {tolerance_pct} % tolerance"),
        Finding::BetterWithinTolerance => {
            format!("better, but within the {tolerance_pct} % tolerance: no difference that matters")
        }
        Finding::Regression => format!("regression beyond the {tolerance_pct} % tolerance"),
    };
    let bimodal = if c.statistic == "mean" {
        " (bimodal: no median, compared by the mean)"
    } else {
        ""
    };
    format!(
        "{} {} ({}){bimodal}: {} → {}, {:+.1} % [CI {:+.1}, {:+.1}], p={:.2e} (Holm) — {verdict}",
        c.metric,
        c.statistic,
        c.cell,
        fmt_value(c.before, &c.unit),
        fmt_value(c.after, &c.unit),
        c.change_pct,
        c.ci_low_pct,
        c.ci_high_pct,
        c.p_adjusted,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: JudgePolicy = JudgePolicy {
        tolerance_pct: 5.0,
        alpha: 0.05,
        bootstrap_resamples: 1000,
        seed: 7,
        min_effect_ms: 0.0,
    };

    /// Fixed "noisy" samples around `centre`: a deterministic spread of ±4 %.
    fn noisy(centre: f64, n: usize, phase: usize) -> Vec<f64> {
        (0..n)
            .map(|i| centre * (1.0 + 0.04 * (((i * 7 + phase * 3) % 11) as f64 / 5.0 - 1.0)))
            .collect()
    }

    fn metric(name: &str, better: Better, before: Vec<f64>, after: Vec<f64>) -> MetricSamples {
        MetricSamples {
            metric: name.into(),
            cell: "prompt 16 / output 24 / concurrency 1".into(),
            unit: "ms".into(),
            better,
            before,
            after,
        }
    }

    /// Textbook values: U and p of a small, tie-free example, and of two
    /// identical sets.
    #[test]
    fn mann_whitney_known_values() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let b = [9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0];
        let r = mann_whitney(&a, &b);
        assert_eq!(r.u, 0.0);
        // z = (32 − 0.5) / sqrt(8·8·17/12) = 3.309…, p ≈ 0.00094.
        assert!((r.z.abs() - 3.309).abs() < 0.01, "{r:?}");
        assert!((r.p - 0.00094).abs() < 0.0001, "{r:?}");
        let same = mann_whitney(&a, &a);
        assert!(same.p > 0.9, "{same:?}");
        assert_eq!(mann_whitney(&[5.0; 6], &[5.0; 6]).p, 1.0);
    }

    #[test]
    fn normal_tail_and_quantiles() {
        assert!((normal_sf(1.959_964) - 0.025).abs() < 1e-6);
        assert!((normal_sf(0.0) - 0.5).abs() < 1e-7);
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&s, 0.5), 2.5);
        assert_eq!(quantile(&s, 0.0), 1.0);
        assert!((quantile(&s, 0.9) - 3.7).abs() < 1e-12);
    }

    /// Holm: sorted p × (m − rank), made monotone, capped at 1.
    #[test]
    fn holm_adjusts_in_order() {
        let adj = holm(&[0.01, 0.04, 0.03, 0.5]);
        assert_eq!(adj, vec![0.04, 0.09, 0.09, 0.5]);
    }

    /// The interval covers the true change and is reproducible.
    #[test]
    fn bootstrap_interval_covers_the_shift() {
        let a = noisy(100.0, 30, 0);
        let b: Vec<f64> = noisy(100.0, 30, 1).iter().map(|x| x * 1.2).collect();
        let (lo, hi) = bootstrap_change_ci(&a, &b, median_of, 2000, 0.05, 1);
        assert!(lo > 10.0 && hi < 30.0 && lo < 20.0 && hi > 20.0, "[{lo}, {hi}]");
        assert_eq!((lo, hi), bootstrap_change_ci(&a, &b, median_of, 2000, 0.05, 1));
    }

    /// A 20 % slowdown is a regression beyond a 5 % tolerance.
    #[test]
    fn twenty_percent_slower_is_rejected() {
        let before = noisy(40.0, 24, 0);
        let after: Vec<f64> = noisy(40.0, 24, 2).iter().map(|x| x * 1.2).collect();
        let r = judge(&[metric("e2e", Better::Lower, before, after)], 0, 0, POLICY);
        assert_eq!(r.judgement, Judgement::Regressed, "{r:#?}");
        assert!(r.reasons[0].starts_with("e2e p50"), "{:?}", r.reasons);
        assert!(r.reasons[0].contains("regression beyond the 5 % tolerance"));
        let c = &r.comparisons[0];
        assert!(c.change_pct > 15.0 && c.ci_low_pct > 5.0, "{c:?}");
    }

    /// A 15 % speed-up (lower latency, higher throughput) is a win.
    #[test]
    fn fifteen_percent_faster_is_improved() {
        let lat_before = noisy(40.0, 24, 0);
        let lat_after: Vec<f64> = noisy(40.0, 24, 3).iter().map(|x| x * 0.85).collect();
        let tp_before = noisy(500.0, 12, 0);
        let tp_after: Vec<f64> = noisy(500.0, 12, 1).iter().map(|x| x / 0.85).collect();
        let mut tp = metric("throughput", Better::Higher, tp_before, tp_after);
        tp.unit = "tok/s".into();
        let r = judge(&[metric("e2e", Better::Lower, lat_before, lat_after), tp], 0, 0, POLICY);
        assert_eq!(r.judgement, Judgement::Improved, "{r:#?}");
        assert!(r.comparisons.iter().all(|c| c.finding == Finding::Better), "{r:#?}");
    }

    /// Samples drawn from the same spread are "no significant difference",
    /// even when the point estimate happens to look a little better.
    #[test]
    fn noise_is_no_significant_difference_not_a_win() {
        let before = noisy(40.0, 20, 0);
        let after: Vec<f64> = noisy(40.0, 20, 5).iter().map(|x| x * 0.99).collect();
        let r = judge(&[metric("e2e", Better::Lower, before, after)], 0, 0, POLICY);
        assert_eq!(r.judgement, Judgement::NoSignificantDifference, "{r:#?}");
        assert!(r.comparisons[0].change_pct < 0.0, "looks better on its face");
        assert!(r.reasons.last().unwrap().contains("not a win"));
    }

    /// A bimodal set is not summarised by a median: the centre is compared
    /// by the mean and the shape is reported with both modes.
    #[test]
    fn bimodal_sets_are_compared_by_mean_and_say_so() {
        let mut before = noisy(10.0, 20, 0);
        before.extend(noisy(40.0, 20, 1));
        let mut after = noisy(10.0, 20, 2);
        after.extend(noisy(40.0, 20, 3));
        let r = judge(&[metric("ttft", Better::Lower, before.clone(), after)], 0, 0, POLICY);
        let c = &r.comparisons[0];
        assert_eq!(c.statistic, "mean");
        assert!(
            matches!(
                c.before_shape,
                Shape::Bimodal {
                    low: (20, _),
                    high: (20, _)
                }
            ),
            "{c:?}"
        );
        assert_eq!(r.judgement, Judgement::NoSignificantDifference);
        // More requests landing in the slow mode is a regression, by the mean.
        let mut worse = noisy(10.0, 8, 2);
        worse.extend(noisy(40.0, 32, 3));
        let r = judge(&[metric("ttft", Better::Lower, before, worse)], 0, 0, POLICY);
        assert_eq!(r.judgement, Judgement::Regressed, "{r:#?}");
        assert!(r.reasons[0].contains("bimodal: no median"), "{:?}", r.reasons);
    }

    /// The CI run that wedged this: a rollback's ttft p90 drifted 13.15 →
    /// 14.60 ms (+11 %, significant) between two runs minutes apart on a busy
    /// 2-core host. Under the absolute floor that is noted, not a regression;
    /// the same relative change on a 100 ms scale still is.
    #[test]
    fn a_significant_drift_under_the_absolute_floor_is_not_a_regression() {
        let floor = JudgePolicy {
            min_effect_ms: 2.0,
            tolerance_pct: 10.0,
            ..POLICY
        };
        let small = [metric("ttft", Better::Lower, noisy(13.15, 32, 0), noisy(14.6, 32, 1))];
        let r = judge(&small, 0, 0, floor);
        assert_eq!(r.judgement, Judgement::NoSignificantDifference, "{:?}", r.reasons);
        assert!(
            r.comparisons.iter().any(|c| c.finding == Finding::UnderFloor),
            "{:?}",
            r.comparisons
        );
        assert!(
            r.reasons[0].contains("significant but under the 2 ms min_effect_ms floor"),
            "{:?}",
            r.reasons
        );
        assert!(r.reasons[0].ends_with("not a win"), "{:?}", r.reasons);
        assert!(
            r.reasons[1].contains("is under the min_effect_ms floor: no difference that matters"),
            "{:?}",
            r.reasons
        );
        // Faster by less than the floor is not a win either.
        let faster = [metric("ttft", Better::Lower, noisy(14.6, 32, 0), noisy(13.15, 32, 1))];
        assert_eq!(
            judge(&faster, 0, 0, floor).judgement,
            Judgement::NoSignificantDifference
        );
        let large = [metric("ttft", Better::Lower, noisy(131.5, 32, 0), noisy(146.0, 32, 1))];
        assert_eq!(judge(&large, 0, 0, floor).judgement, Judgement::Regressed);
        // Throughput is not in milliseconds: the floor does not apply.
        let mut tput = metric("throughput", Better::Higher, noisy(13.15, 32, 0), noisy(11.0, 32, 1));
        tput.unit = "tok/s".into();
        assert_eq!(judge(&[tput], 0, 0, floor).judgement, Judgement::Regressed);
    }

    /// Significant but small is worse-within-tolerance, not a rejection.
    #[test]
    fn small_significant_slowdown_is_within_tolerance() {
        let before = noisy(40.0, 40, 0);
        let after: Vec<f64> = before.iter().map(|x| x * 1.03).collect();
        let r = judge(&[metric("itl", Better::Lower, before, after)], 0, 0, POLICY);
        assert_eq!(r.judgement, Judgement::WorseWithinTolerance, "{r:#?}");
    }

    /// Requests that fail only after the change reject it whatever the latencies.
    #[test]
    fn new_failures_reject() {
        let s = noisy(40.0, 10, 0);
        let r = judge(&[metric("e2e", Better::Lower, s.clone(), s)], 0, 2, POLICY);
        assert_eq!(r.judgement, Judgement::Regressed);
        assert!(r.reasons[0].contains("2 benchmark requests failed"));
    }

    /// A significant improvement smaller than the tolerance is not a win
    /// (the CI run's no-op knob: throughput +2.8 % with a 5 % tolerance);
    /// one beyond it is.
    #[test]
    fn improvement_within_the_tolerance_is_not_a_win() {
        let mut tp = metric("throughput", Better::Higher, noisy(583.0, 32, 0), noisy(599.0, 32, 1));
        tp.unit = "tok/s".into();
        let r = judge(std::slice::from_ref(&tp), 0, 0, POLICY);
        assert_eq!(r.comparisons[0].finding, Finding::BetterWithinTolerance, "{r:?}");
        assert_eq!(r.judgement, Judgement::NoSignificantDifference);
        assert!(
            r.reasons[0].contains("better by less than the 5 % tolerance"),
            "{:?}",
            r.reasons
        );
        let mut big = metric("throughput", Better::Higher, noisy(583.0, 32, 0), noisy(680.0, 32, 1));
        big.unit = "tok/s".into();
        assert_eq!(judge(&[big], 0, 0, POLICY).judgement, Judgement::Improved);
    }
}
