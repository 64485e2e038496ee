//! The continuous watch of a pair as `status` and the readiness endpoint
//! show it: the pair's state, its breaker, and each unit as the wedge judge
//! assessed it.

use serde::{Deserialize, Serialize};

use crate::judge::wedge::UnitAssessment;

/// What `status`, the readiness endpoint and its metrics show of one pair
/// (the wire's view: the CLI reads it back typed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairWatchView {
    pub pair: String,
    /// `healthy`, `unproven`, `suspect`, `wedged`, `down`, `recovering`,
    /// `operation_running`, `held`, `starting` or `watch_failed` (the
    /// watch panicked and restarts: the orchestrator's `ops::watcher::supervise`).
    pub state: String,
    /// What the readiness endpoint answers: only a `healthy` pair is ready.
    pub ready: bool,
    pub reasons: Vec<String>,
    /// Set when the circuit breaker holds the pair for a human.
    pub held: Option<String>,
    pub auto_recover: bool,
    pub recoveries_in_window: u32,
    pub max_recoveries: u32,
    pub recovery_window_ms: u64,
    pub probes_sent: u64,
    pub probes_deferred: u64,
    pub last_probe: Option<serde_json::Value>,
    pub last_recovery: Option<RecoveryView>,
    pub units: Vec<WatchedUnit>,
}

/// One unit of a watched pair as `status` shows it: the judge's assessment
/// without what only the judge uses (the wedge's onset instant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchedUnit {
    pub host: String,
    pub unit: String,
    pub role: String,
    pub state: crate::judge::wedge::UnitState,
    pub reasons: Vec<String>,
    pub metrics: Option<crate::judge::wedge::Metrics>,
    pub health_status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wedge: Option<WedgeView>,
}

/// A confirmed wedge as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WedgeView {
    pub kind: crate::judge::wedge::WedgeKind,
    /// How long the silence had lasted when the wedge was confirmed.
    pub silent_ms: u64,
    /// How the evidence rules out legitimate work, one line per argument.
    pub ruled_out: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecoveryView {
    pub operation_id: String,
    /// The evidence that triggered it.
    pub reasons: Vec<String>,
    /// CLOCK_MONOTONIC ms when the wedge was confirmed and when the recovery concluded.
    pub detected_mono_ms: f64,
    pub concluded_mono_ms: Option<f64>,
    pub verdict: Option<String>,
    /// The wedge's kind and the time from its onset to its confirmation.
    pub kind: Option<String>,
    pub detection_ms: Option<u64>,
}

impl WatchedUnit {
    /// The view of `a`, a unit on `host`.
    pub fn of(host: String, a: UnitAssessment) -> Self {
        WatchedUnit {
            host,
            unit: a.unit,
            role: a.role,
            state: a.state,
            reasons: a.reasons,
            metrics: a.metrics,
            health_status: a.health_status,
            wedge: a.wedge.map(|w| WedgeView {
                kind: w.kind,
                silent_ms: w.silent_ms,
                ruled_out: w.ruled_out,
            }),
        }
    }

    /// A unit is ready when it serves or idles (not stalled, wedged, down or unknown).
    pub fn ready(&self) -> bool {
        matches!(
            self.state,
            crate::judge::wedge::UnitState::Serving | crate::judge::wedge::UnitState::Idle
        )
    }
}
