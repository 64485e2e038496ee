//! Time: the simulated/real conversion and the host's monotonic clock.
//!
//! Two clocks, on purpose. Durations the engine *simulates* are scaled by
//! `--time-scale` and slept on tokio's clock ([`Scale`], [`SimClock`]), so tests
//! can run a minute-long start-up in a fraction of a second. Phase transitions are
//! also *recorded* on the kernel's `CLOCK_MONOTONIC` ([`mono_ms`]), which every
//! process on the host shares: pdwarden's agent stamps its observations on the same
//! clock, so `/sim/stats`' `listen_mono_ms`/`ready_mono_ms` against the agent's
//! timeline is a direct measure of detection lag.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use tokio::time::Instant;

/// Milliseconds on the host's `CLOCK_MONOTONIC`.
pub fn mono_ms() -> f64 {
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => ts.tv_sec() as f64 * 1000.0 + ts.tv_nsec() as f64 / 1e6,
        // CLOCK_MONOTONIC cannot fail on Linux; NaN would show up in stats, not panic.
        Err(_) => f64::NAN,
    }
}

/// `--time-scale`: real duration = simulated duration × factor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale(pub f64);

impl Scale {
    /// Real time for `sim_ms` simulated milliseconds.
    pub fn real(self, sim_ms: f64) -> Duration {
        let ms = (sim_ms * self.0).max(0.0);
        if ms.is_finite() {
            Duration::from_secs_f64(ms / 1000.0)
        } else {
            Duration::MAX
        }
    }

    /// Simulated milliseconds in a real duration.
    pub fn sim_ms(self, real: Duration) -> f64 {
        real.as_secs_f64() * 1000.0 / self.0
    }
}

/// `base + d`, saturating at "never" (about 30 years) instead of overflowing.
pub fn far_after(base: Instant, d: Duration) -> Instant {
    const NEVER: Duration = Duration::from_secs(30 * 365 * 86_400);
    base.checked_add(d.min(NEVER)).unwrap_or(base + NEVER)
}

/// The engine's simulated clock: simulated ms since the process started, read from
/// tokio's clock (so paused-time tests govern it).
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    pub origin: Instant,
    pub scale: Scale,
}

impl SimClock {
    pub fn new(scale: Scale) -> SimClock {
        SimClock {
            origin: Instant::now(),
            scale,
        }
    }

    /// Simulated ms since start.
    pub fn now_ms(&self) -> f64 {
        self.scale.sim_ms(self.origin.elapsed())
    }

    /// The real instant `sim_ms` simulated ms after start.
    pub fn at(&self, sim_ms: f64) -> Instant {
        far_after(self.origin, self.scale.real(sim_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Scaling is a plain multiplication both ways.
    #[test]
    fn scale_round_trips() {
        let s = Scale(0.01);
        assert_eq!(s.real(56_000.0), Duration::from_millis(560));
        assert!((s.sim_ms(Duration::from_millis(560)) - 56_000.0).abs() < 1e-6);
        assert_eq!(Scale(1.0).real(f64::INFINITY), Duration::MAX);
    }

    // The monotonic clock moves forward.
    #[test]
    fn mono_is_monotonic() {
        let a = mono_ms();
        let b = mono_ms();
        assert!(a > 0.0 && b >= a);
    }
}
