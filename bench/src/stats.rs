//! Distributions and the analytic fixed-interval pollers.
//!
//! Figures are reported as distributions of one run (medians and p99s), never
//! as single timings, because this machine is shared and noisy. The random
//! numbers come from a seeded xorshift so a table can be reproduced from the
//! same start timelines.

/// A small deterministic PRNG (xorshift64*), enough for poller phases.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The `q` quantile (0..=1) by the nearest-rank method; NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

pub fn median(values: &[f64]) -> f64 {
    quantile(values, 0.5)
}

pub fn p99(values: &[f64]) -> f64 {
    quantile(values, 0.99)
}

/// Detection lag of a poller that checks every `period_ms`, starting at a
/// uniformly random phase after `poll_origin_ms`, for a transition at
/// `transition_ms` (same clock): the time from the transition to the first
/// poll at or after it. `phase` in [0, 1) places the first poll. The poll
/// itself is taken as instantaneous, which favours the poller.
pub fn poller_lag(poll_origin_ms: f64, transition_ms: f64, period_ms: f64, phase: f64) -> f64 {
    let first = poll_origin_ms + phase * period_ms;
    if transition_ms <= first {
        return first - transition_ms;
    }
    let k = ((transition_ms - first) / period_ms).ceil();
    first + k * period_ms - transition_ms
}

/// Formats milliseconds for the table: "12.3 ms", "4.1 s".
pub fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        "n/a".into()
    } else if ms.abs() >= 10_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else if ms.abs() >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller's lag is never negative and never reaches its period.
    #[test]
    fn poller_lag_is_within_one_period() {
        let mut rng = Rng::new(7);
        for i in 0..1000 {
            let t = i as f64 * 13.7;
            let lag = poller_lag(0.0, t, 8000.0, rng.unit());
            assert!((0.0..8000.0).contains(&lag), "{lag}");
        }
    }

    /// Nearest-rank quantiles of 1..=100.
    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(median(&v), 50.0);
        assert_eq!(p99(&v), 99.0);
        assert!(median(&[]).is_nan());
    }
}
