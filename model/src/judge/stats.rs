//! Summaries of latency samples that do not lie about their shape.
//!
//! Seed 000 quoted medians of a distribution that had two modes (probes that
//! hit a cached prefix and probes that did not); the median described
//! neither. So nothing here quotes a median before checking for bimodality:
//! a bimodal set is reported as its modes.
//!
//! The test is deliberately simple and explainable to an operator: sort the
//! samples, find the widest gap between neighbours on a log scale, and call
//! the set bimodal when that gap is a factor of at least
//! [`BIMODAL_GAP_RATIO`] and each side holds at least [`MIN_MODE_SHARE`] of
//! the samples (and at least two of them). Pure: no I/O, no clock.

use serde::{Deserialize, Serialize};

/// The smallest ratio between the two clusters' neighbouring samples that
/// counts as a separate mode.
pub const BIMODAL_GAP_RATIO: f64 = 3.0;
/// The smallest share of samples each mode must hold.
pub const MIN_MODE_SHARE: f64 = 0.15;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mode {
    pub count: usize,
    pub median_ms: u64,
    pub min_ms: u64,
    pub max_ms: u64,
}

/// A latency set's summary: a median only when one describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum LatencySummary {
    Empty,
    Unimodal {
        count: usize,
        median_ms: u64,
        min_ms: u64,
        max_ms: u64,
    },
    Bimodal {
        low: Mode,
        high: Mode,
    },
}

fn median(sorted: &[u64]) -> u64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2
    }
}

fn mode(sorted: &[u64]) -> Mode {
    Mode {
        count: sorted.len(),
        median_ms: median(sorted),
        min_ms: sorted[0],
        max_ms: sorted[sorted.len() - 1],
    }
}

/// Summarises latencies (ms), reporting modes instead of a median when the set is bimodal.
pub fn summarize(samples: &[u64]) -> LatencySummary {
    if samples.is_empty() {
        return LatencySummary::Empty;
    }
    let mut s = samples.to_vec();
    s.sort_unstable();
    let n = s.len();
    let min_side = ((n as f64 * MIN_MODE_SHARE).ceil() as usize).max(2);
    let best_split = (1..n)
        .filter(|&i| i >= min_side && n - i >= min_side)
        .map(|i| (i, s[i] as f64 / (s[i - 1].max(1)) as f64))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match best_split {
        Some((i, ratio)) if ratio >= BIMODAL_GAP_RATIO => LatencySummary::Bimodal {
            low: mode(&s[..i]),
            high: mode(&s[i..]),
        },
        _ => {
            let m = mode(&s);
            LatencySummary::Unimodal {
                count: m.count,
                median_ms: m.median_ms,
                min_ms: m.min_ms,
                max_ms: m.max_ms,
            }
        }
    }
}

impl LatencySummary {
    /// One line for people: "median 0.31 s (n=12, 0.25–0.40 s)" or the two modes.
    pub fn describe(&self) -> String {
        match self {
            Self::Empty => "no samples".into(),
            Self::Unimodal {
                count,
                median_ms,
                min_ms,
                max_ms,
            } => format!(
                "median {} (n={count}, {}–{})",
                secs(*median_ms),
                secs(*min_ms),
                secs(*max_ms)
            ),
            Self::Bimodal { low, high } => format!(
                "bimodal, no single median: {} samples around {} ({}–{}) and {} around {} ({}–{})",
                low.count,
                secs(low.median_ms),
                secs(low.min_ms),
                secs(low.max_ms),
                high.count,
                secs(high.median_ms),
                secs(high.min_ms),
                secs(high.max_ms)
            ),
        }
    }
}

/// Formats milliseconds the way the incident reports quote them ("17.9 s").
pub fn secs(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.2} s", ms as f64 / 1000.0)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 000's shape: fast probes that hit the cached prefix, slow ones
    /// that minted a session. The median (which lands in between or on one
    /// side) is not quoted; the two modes are.
    #[test]
    fn two_clusters_are_reported_as_modes() {
        let samples = [180, 200, 210, 190, 205, 1_700, 1_650, 1_800, 1_720, 1_690];
        match summarize(&samples) {
            LatencySummary::Bimodal { low, high } => {
                assert_eq!((low.count, high.count), (5, 5));
                assert_eq!(low.median_ms, 200);
                assert_eq!(high.median_ms, 1_700);
            }
            other => panic!("expected bimodal, got {other:?}"),
        }
        assert!(summarize(&samples).describe().starts_with("bimodal, no single median"));
    }

    #[test]
    fn one_cluster_gets_a_median() {
        let s = summarize(&[300, 310, 290, 305, 500, 295]);
        assert_eq!(
            s,
            LatencySummary::Unimodal {
                count: 6,
                median_ms: 302,
                min_ms: 290,
                max_ms: 500
            }
        );
    }

    /// A single outlier is not a mode: it needs a share of the samples.
    #[test]
    fn a_lone_outlier_is_not_a_second_mode() {
        let mut v = vec![200u64; 19];
        v.push(20_000);
        assert!(matches!(summarize(&v), LatencySummary::Unimodal { .. }));
    }

    #[test]
    fn tiny_and_empty_sets() {
        assert_eq!(summarize(&[]), LatencySummary::Empty);
        assert!(matches!(summarize(&[5]), LatencySummary::Unimodal { median_ms: 5, .. }));
        assert!(matches!(summarize(&[5, 5_000]), LatencySummary::Unimodal { .. }));
    }
}

/// Requests sent and those that failed, on one side of a comparison.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub failed: usize,
    pub requests: usize,
}

impl Tally {
    pub fn new(failed: usize, requests: usize) -> Tally {
        Tally {
            failed,
            requests: requests.max(failed),
        }
    }
}

/// One-sided Fisher exact test (issue 47: failures compared as rates, not
/// counts): the probability, were both sides' failures drawn from one rate,
/// that `after` would hold at least as many of them as it does, given how
/// many requests each side sent (the hypergeometric tail). 1 when `after`
/// failed nothing. 0 failures of 64 before against 1 of 192 after is
/// p = 0.75: no evidence; 0 of 64 against 8 of 64 is p < 0.005.
pub fn failure_rate_rose_p(before: Tally, after: Tally) -> f64 {
    use statrs::distribution::{DiscreteCDF, Hypergeometric};
    if after.failed == 0 {
        return 1.0;
    }
    let population = (before.requests + after.requests) as u64;
    let failed = (before.failed + after.failed) as u64;
    match Hypergeometric::new(population, failed, after.requests as u64) {
        // P(X >= k) = 1 - P(X <= k - 1).
        Ok(h) => h.sf(after.failed as u64 - 1),
        Err(_) => 1.0,
    }
}

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn failure_rates_are_compared_by_the_exact_test() {
        let p = |b: (usize, usize), a: (usize, usize)| failure_rate_rose_p(Tally::new(b.0, b.1), Tally::new(a.0, a.1));
        // The two cases: neither is a rise a test can show.
        assert!((p((0, 64), (1, 192)) - 0.75).abs() < 1e-9, "{}", p((0, 64), (1, 192)));
        assert!(p((1, 64), (2, 192)) > 0.5);
        assert!(p((0, 64), (8, 64)) < 0.005, "{}", p((0, 64), (8, 64)));
        assert_eq!(p((3, 64), (0, 64)), 1.0);
        // Fewer failures after is never a rise.
        assert!(p((8, 64), (1, 64)) > 0.99);
    }
}
