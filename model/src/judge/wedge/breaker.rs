//! The recovery circuit breaker: at most so many automatic recoveries per
//! pair per window, then the pair is held for a human. A recovery kills
//! every request in flight, so a pair that keeps wedging after its
//! recoveries needs someone to look, not another restart. Counted in the
//! process's monotonic time and seeded from the journal
//! ([`recoveries_still_counting`]), so an orchestrator that restarts between
//! recoveries does not recover a wedging pair without bound.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::s;

/// At most `max` automatic recoveries per pair per `window`; the next
/// confirmed wedge holds the pair for a human.
#[derive(Debug, Clone)]
pub struct Breaker {
    pub max: u32,
    pub window: Duration,
    recoveries: VecDeque<Instant>,
    held: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BreakerDecision {
    /// Go ahead; this is the `nth` recovery in the window.
    Recover { nth: u32 },
    /// Held for a human; the reason says why.
    Hold { reason: String },
}

impl Breaker {
    pub fn new(max: u32, window: Duration) -> Self {
        Breaker {
            max,
            window,
            recoveries: VecDeque::new(),
            held: None,
        }
    }

    fn prune(&mut self, now: Instant) {
        while self
            .recoveries
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            self.recoveries.pop_front();
        }
    }

    /// Recoveries counted in the window ending at `now`.
    pub fn in_window(&mut self, now: Instant) -> u32 {
        self.prune(now);
        self.recoveries.len() as u32
    }

    /// Called for a confirmed wedge: allows (and counts) a recovery, or holds.
    pub fn decide(&mut self, now: Instant) -> BreakerDecision {
        self.prune(now);
        if let Some(reason) = &self.held {
            return BreakerDecision::Hold { reason: reason.clone() };
        }
        if self.recoveries.len() as u32 >= self.max {
            let reason = format!(
                "held for a human: {} automatic recoveries within {} and the pair wedged again",
                self.recoveries.len(),
                s(self.window)
            );
            self.held = Some(reason.clone());
            return BreakerDecision::Hold { reason };
        }
        self.recoveries.push_back(now);
        BreakerDecision::Recover {
            nth: self.recoveries.len() as u32,
        }
    }

    pub fn held(&self) -> Option<&str> {
        self.held.as_deref()
    }

    /// Counts recoveries that happened before this breaker existed (a
    /// restarted orchestrator), `ages` before `now`; those older than the
    /// window are ignored. Without this, an orchestrator that restarts
    /// between recoveries would recover a wedging pair without bound.
    pub fn seed(&mut self, ages: &[Duration], now: Instant) {
        let mut at: Vec<Instant> = ages
            .iter()
            .filter(|a| **a < self.window)
            // A monotonic clock younger than the age (the host rebooted):
            // counted as recent, erring on the side of holding.
            .map(|a| now.checked_sub(*a).unwrap_or(now))
            .collect();
        at.sort();
        self.recoveries.extend(at);
    }

    /// A human took over (e.g. an operator's co-restart ended healthy).
    pub fn release(&mut self) {
        self.held = None;
        self.recoveries.clear();
    }
}

/// One earlier operation of a pair, as the breaker's seeding needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PastOperation {
    pub started_unix_ms: u64,
    /// Started by the watch (request id `auto-…`).
    pub automatic: bool,
    /// A human's co-restart that ended healthy: it releases the breaker.
    pub human_healthy_restart: bool,
}

/// The ages of the automatic recoveries a new breaker must still count:
/// those within `window` of `now_unix_ms` and after the newest healthy
/// co-restart by a human (which released the breaker). `history` is newest
/// first, as the journal returns it.
pub fn recoveries_still_counting(history: &[PastOperation], now_unix_ms: u64, window: Duration) -> Vec<Duration> {
    history
        .iter()
        .take_while(|op| !op.human_healthy_restart)
        .filter(|op| op.automatic)
        .map(|op| Duration::from_millis(now_unix_ms.saturating_sub(op.started_unix_ms)))
        .filter(|age| *age < window)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restarted orchestrator's breaker counts the recoveries the journal
    /// holds: within the window, after the last human's healthy restart.
    #[test]
    fn breaker_seeded_from_the_journal_survives_an_orchestrator_restart() {
        let op = |ago_s: u64, automatic: bool, human: bool| PastOperation {
            started_unix_ms: 10_000_000 - ago_s * 1000,
            automatic,
            human_healthy_restart: human,
        };
        // Newest first: two recent recoveries, a verify, one recovery before
        // a human's healthy restart (released), one older still.
        let history = [
            op(100, true, false),
            op(700, true, false),
            op(800, false, false),
            op(900, true, false),
            op(1_000, false, true),
            op(1_100, true, false),
        ];
        let ages = recoveries_still_counting(&history, 10_000_000, Duration::from_secs(3_600));
        assert_eq!(
            ages,
            [100, 700, 900].map(Duration::from_secs).to_vec(),
            "the released one does not count"
        );
        assert_eq!(
            recoveries_still_counting(&history, 10_000_000, Duration::from_secs(750)),
            [100, 700].map(Duration::from_secs).to_vec()
        );
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        let now = Instant::now() + Duration::from_secs(10_000);
        b.seed(&ages, now);
        assert_eq!(b.in_window(now), 3);
        assert!(
            matches!(b.decide(now), BreakerDecision::Hold { .. }),
            "a 4th within the hour is held"
        );
        // The oldest falls out of the window 2700 s later: one more allowed.
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        b.seed(&ages, now);
        assert_eq!(
            b.decide(now + Duration::from_secs(2_701)),
            BreakerDecision::Recover { nth: 3 }
        );
    }

    /// The breaker: N recoveries per window, then the pair is held until a
    /// human releases it; recoveries older than the window stop counting.
    #[test]
    fn breaker_holds_after_n_recoveries_in_the_window() {
        let mut b = Breaker::new(3, Duration::from_secs(3_600));
        let t0 = Instant::now();
        for n in 1..=3 {
            assert_eq!(
                b.decide(t0 + Duration::from_secs(600 * n as u64)),
                BreakerDecision::Recover { nth: n }
            );
        }
        match b.decide(t0 + Duration::from_secs(2_400)) {
            BreakerDecision::Hold { reason } => {
                assert!(reason.contains("3 automatic recoveries within 3600.0 s"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // Held stays held, even once the window has passed, until released.
        assert!(matches!(
            b.decide(t0 + Duration::from_secs(9_000)),
            BreakerDecision::Hold { .. }
        ));
        b.release();
        assert_eq!(
            b.decide(t0 + Duration::from_secs(9_001)),
            BreakerDecision::Recover { nth: 1 }
        );
        // Without a hold, old recoveries fall out of the window.
        let mut b = Breaker::new(1, Duration::from_secs(60));
        assert_eq!(b.decide(t0), BreakerDecision::Recover { nth: 1 });
        assert_eq!(
            b.decide(t0 + Duration::from_secs(61)),
            BreakerDecision::Recover { nth: 1 }
        );
    }
}
