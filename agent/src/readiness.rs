//! Start-up phase detection: `spawned → refused → http_503 → healthy →
//! generating`, observed as it happens.
//!
//! The classification is a pure, clock-injected state machine,
//! [`ReadinessWatch`]: it is handed each observation together with the
//! instant it was made and answers with the phase event to emit, if any. It
//! never does I/O and never reads a clock, so its rules are plain unit tests.
//! [`watch`] is the thin driver that polls a [`Checker`] (real HTTP in
//! production, a scripted fake under paused time in tests) and feeds it.
//!
//! Rules:
//! - an event is emitted only when the phase changes, stamped with the
//!   moment of the observation that changed it (ms since the command);
//! - health 2xx is `healthy`, never readiness: only a passed generation check
//!   is `generating` (INCIDENTS row 3), after which the watch ends;
//! - a failed generation check keeps the watch polling; its reason is kept for
//!   the `not_ready` summary if the deadline passes.

use std::future::Future;
use std::time::Duration;

use pdwarden_proto::v1::{ChatProbe, Phase, ReadinessSpec};
use tokio::time::{Instant, sleep_until};

pub const DEFAULT_DEADLINE_MS: u64 = 120_000;
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 20;
pub const DEFAULT_CHECK_TIMEOUT_MS: u64 = 5_000;
/// Health requests are cut off after at most this long (or the check timeout
/// if shorter): a hung `/health` is itself a not-ready answer, and polling must
/// stay fast.
pub const MAX_HEALTH_TIMEOUT_MS: u64 = 2_000;
/// `max_tokens` of a chat generation check whose spec leaves it 0.
pub const DEFAULT_CHECK_MAX_TOKENS: u32 = 8;

/// A `ReadinessSpec` with the proto's zero values replaced by defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadinessParams {
    pub deadline: Duration,
    pub poll_interval: Duration,
    pub check_timeout: Duration,
    pub health_timeout: Duration,
    /// `Some`: the generation check is this chat completion; `None`: a GET of
    /// the unit's generation path.
    pub chat: Option<ChatProbe>,
}

impl ReadinessParams {
    pub fn from_spec(spec: Option<&ReadinessSpec>) -> Self {
        let or = |v: u64, d: u64| Duration::from_millis(if v == 0 { d } else { v });
        let spec = spec.cloned().unwrap_or_default();
        let check_timeout = or(spec.check_timeout_ms, DEFAULT_CHECK_TIMEOUT_MS);
        let chat = spec.chat.map(|mut c| {
            if c.max_tokens == 0 {
                c.max_tokens = DEFAULT_CHECK_MAX_TOKENS;
            }
            c
        });
        ReadinessParams {
            deadline: or(spec.deadline_ms, DEFAULT_DEADLINE_MS),
            poll_interval: or(spec.poll_interval_ms, DEFAULT_POLL_INTERVAL_MS),
            health_timeout: check_timeout.min(Duration::from_millis(MAX_HEALTH_TIMEOUT_MS)),
            check_timeout,
            chat,
        }
    }
}

impl Default for ReadinessParams {
    fn default() -> Self {
        Self::from_spec(None)
    }
}

/// What one poll of the health endpoint saw.
#[derive(Debug, Clone, PartialEq)]
pub enum HealthObservation {
    /// The TCP connection failed: refused (nothing listens yet) or another
    /// connect error (reported as `refused` too, with the error as detail).
    Refused { error: String },
    /// The endpoint answered with this status (2xx or not).
    Status { status: u16 },
    /// No answer within the health timeout.
    TimedOut { after: Duration },
    /// The port is open but the request failed (reset, bad response, …).
    Failed { error: String },
}

/// What one generation check saw.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationObservation {
    /// Generated (chat: ≥1 token; GET: 2xx). `detail` is the evidence.
    /// `tokens` is the completion tokens a chat check returned (0 for GET checks).
    Passed {
        latency: Duration,
        tokens: u32,
        detail: String,
    },
    /// Answered, but not with generation (non-2xx, no tokens, bad body …).
    Failed { latency: Duration, reason: String },
    /// No answer within the check timeout.
    TimedOut { after: Duration },
}

/// A phase transition to report.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseChange {
    pub phase: Phase,
    /// Time from the command's receipt to the observation.
    pub since_command: Duration,
    pub detail: String,
    /// The health status behind `http_503`/`healthy`, else 0.
    pub http_status: i32,
    /// Latency of the generation check behind `generating`.
    pub check_latency: Option<Duration>,
    /// Completion tokens that check returned (chat checks; 0 for GET checks).
    pub check_tokens: u32,
}

/// Which check the driver should run next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextCheck {
    Health,
    Generation,
    Done,
}

/// The pure start-up phase classifier for one start command.
#[derive(Debug, Clone)]
pub struct ReadinessWatch {
    /// When the command was received: the zero of every timestamp.
    received_at: Instant,
    deadline: Instant,
    /// The last phase reported (starts at `spawned`).
    phase: Phase,
    next: NextCheck,
    health_polls: u32,
    generation_attempts: u32,
    /// Summary of the last health observation, for `not_ready`.
    last_health: Option<String>,
    /// Reason of the last failed generation check, for `not_ready`.
    last_generation_failure: Option<String>,
    /// A generation check started at this instant has not reported yet.
    generation_in_flight: Option<Instant>,
}

impl ReadinessWatch {
    /// A watch for a unit spawned on a command received at `received_at`.
    pub fn new(received_at: Instant, deadline: Duration) -> Self {
        ReadinessWatch {
            received_at,
            deadline: received_at + deadline,
            phase: Phase::Spawned,
            next: NextCheck::Health,
            health_polls: 0,
            generation_attempts: 0,
            last_health: None,
            last_generation_failure: None,
            generation_in_flight: None,
        }
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn next_check(&self) -> NextCheck {
        self.next
    }

    /// Records one health poll made at `now`.
    pub fn observe_health(&mut self, obs: HealthObservation, now: Instant) -> Option<PhaseChange> {
        if self.next == NextCheck::Done {
            return None;
        }
        self.health_polls += 1;
        let (phase, detail, status) = match &obs {
            HealthObservation::Refused { error } if !error.to_lowercase().contains("refused") => {
                (Phase::Refused, format!("connect failed: {error}"), 0)
            }
            HealthObservation::Refused { .. } => (Phase::Refused, "connection refused".into(), 0),
            HealthObservation::Status { status } if (200..300).contains(status) => {
                (Phase::Healthy, format!("health {status}"), *status)
            }
            HealthObservation::Status { status } => (Phase::Http503, format!("http {status}"), *status),
            HealthObservation::TimedOut { after } => (
                Phase::Http503,
                format!("health timed out after {} ms", after.as_millis()),
                0,
            ),
            HealthObservation::Failed { error } => (Phase::Http503, format!("health request failed: {error}"), 0),
        };
        self.last_health = Some(detail.clone());
        self.next = if phase == Phase::Healthy {
            NextCheck::Generation
        } else {
            NextCheck::Health
        };
        self.transition(phase, now, detail, i32::from(status), None)
    }

    /// Notes that a generation check starts at `now` (for the deadline summary).
    pub fn generation_started(&mut self, now: Instant) {
        self.generation_in_flight = Some(now);
    }

    /// Records the outcome of a generation check that finished at `now`.
    pub fn observe_generation(&mut self, obs: GenerationObservation, now: Instant) -> Option<PhaseChange> {
        if self.next == NextCheck::Done {
            return None;
        }
        self.generation_in_flight = None;
        self.generation_attempts += 1;
        match obs {
            GenerationObservation::Passed {
                latency,
                tokens,
                detail,
            } => {
                self.next = NextCheck::Done;
                self.transition(Phase::Generating, now, detail, 0, Some(latency))
                    .map(|change| PhaseChange {
                        check_tokens: tokens,
                        ..change
                    })
            }
            GenerationObservation::Failed { latency, reason } => {
                self.last_generation_failure = Some(format!("{reason} after {} ms", latency.as_millis()));
                self.next = NextCheck::Health;
                None
            }
            GenerationObservation::TimedOut { after } => {
                self.last_generation_failure = Some(format!("timed out after {} ms", after.as_millis()));
                self.next = NextCheck::Health;
                None
            }
        }
    }

    /// At or after the deadline, ends the watch with `not_ready` and a summary
    /// of the last observation.
    pub fn check_deadline(&mut self, now: Instant) -> Option<PhaseChange> {
        if self.next == NextCheck::Done || now < self.deadline {
            return None;
        }
        self.next = NextCheck::Done;
        let limit = self.deadline.duration_since(self.received_at).as_millis();
        let polls = plural(self.health_polls, "health poll");
        let attempts = plural(self.generation_attempts, "attempt");
        let summary = match (
            &self.last_health,
            &self.generation_in_flight,
            &self.last_generation_failure,
        ) {
            (None, _, _) => "no health check completed".to_owned(),
            (Some(h), Some(started), failure) => {
                let mut s = format!(
                    "{h} but generation check still running after {} ms",
                    now.duration_since(*started).as_millis()
                );
                if let Some(f) = failure {
                    let earlier = plural(self.generation_attempts, "earlier attempt");
                    s.push_str(&format!(" ({earlier}, last {f})"));
                }
                s
            }
            (Some(h), None, Some(f)) if self.phase == Phase::Healthy => {
                format!("{h} but generation check {f}, {attempts}")
            }
            (Some(h), None, failure) => {
                let mut s = format!("last health check: {h}, {polls}");
                if let Some(f) = failure {
                    s.push_str(&format!("; last generation check {f} ({attempts})"));
                }
                s
            }
        };
        Some(PhaseChange {
            phase: Phase::NotReady,
            since_command: now.duration_since(self.received_at),
            detail: format!("not generating within {limit} ms: {summary}"),
            http_status: 0,
            check_latency: None,
            check_tokens: 0,
        })
    }

    fn transition(
        &mut self,
        phase: Phase,
        now: Instant,
        detail: String,
        http_status: i32,
        check_latency: Option<Duration>,
    ) -> Option<PhaseChange> {
        if phase == self.phase {
            return None;
        }
        self.phase = phase;
        Some(PhaseChange {
            phase,
            since_command: now.duration_since(self.received_at),
            detail,
            http_status,
            check_latency,
            check_tokens: 0,
        })
    }
}

fn plural(n: u32, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The I/O edge of readiness: one health poll, one generation check.
pub trait Checker: Send + Sync {
    fn health(&self) -> impl Future<Output = HealthObservation> + Send;
    fn generation(&self) -> impl Future<Output = GenerationObservation> + Send;
}

/// Drives `watch` until `generating`, `not_ready`, or until `emit` returns
/// false (the watch was superseded, e.g. the unit is being stopped).
///
/// Health is polled every `poll_interval` (measured from the start of the
/// previous check, so a slow check is followed at once by the next); a 2xx
/// is followed immediately by a generation check. Only one request is in
/// flight at a time. A check still running at the deadline is abandoned.
pub async fn watch<C: Checker>(
    checker: &C,
    mut watch: ReadinessWatch,
    poll_interval: Duration,
    mut emit: impl FnMut(PhaseChange) -> bool,
) {
    let deadline = watch.deadline();
    let mut next_poll = Instant::now();
    loop {
        let check = watch.next_check();
        if check == NextCheck::Done {
            return;
        }
        if check == NextCheck::Health {
            tokio::select! {
                biased;
                _ = sleep_until(next_poll) => {}
                _ = sleep_until(deadline) => {}
            }
        }
        let started = Instant::now();
        let change = if let Some(c) = watch.check_deadline(started) {
            Some(c)
        } else {
            next_poll = started + poll_interval;
            match check {
                NextCheck::Health => tokio::select! {
                    biased;
                    obs = checker.health() => watch.observe_health(obs, Instant::now()),
                    _ = sleep_until(deadline) => watch.check_deadline(Instant::now()),
                },
                NextCheck::Generation => {
                    watch.generation_started(started);
                    tokio::select! {
                        biased;
                        obs = checker.generation() => watch.observe_generation(obs, Instant::now()),
                        _ = sleep_until(deadline) => watch.check_deadline(Instant::now()),
                    }
                }
                NextCheck::Done => None,
            }
        };
        if let Some(change) = change
            && !emit(change)
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn status(s: u16) -> HealthObservation {
        HealthObservation::Status { status: s }
    }

    fn refused() -> HealthObservation {
        HealthObservation::Refused {
            error: "connection refused".into(),
        }
    }

    // Property: the phases of a normal start-up are each reported once, in
    // order, stamped with the observation's own time since the command.
    #[test]
    fn reports_each_phase_once_with_its_observation_time() {
        let t0 = Instant::now();
        let mut w = ReadinessWatch::new(t0, ms(120_000));
        let e = w.observe_health(refused(), t0 + ms(5)).unwrap();
        assert_eq!((e.phase, e.since_command), (Phase::Refused, ms(5)));
        assert_eq!(w.observe_health(refused(), t0 + ms(25)), None);
        let e = w.observe_health(status(503), t0 + ms(64)).unwrap();
        assert_eq!((e.phase, e.since_command, e.http_status), (Phase::Http503, ms(64), 503));
        assert_eq!(w.observe_health(status(500), t0 + ms(84)), None, "same phase, no event");
        let e = w.observe_health(status(200), t0 + ms(72_000)).unwrap();
        assert_eq!((e.phase, e.http_status), (Phase::Healthy, 200));
        assert_eq!(w.next_check(), NextCheck::Generation);
        w.generation_started(t0 + ms(72_000));
        let e = w
            .observe_generation(
                GenerationObservation::Passed {
                    latency: ms(400),
                    tokens: 1,
                    detail: "generation check: 1 token in 400 ms".into(),
                },
                t0 + ms(72_400),
            )
            .unwrap();
        assert_eq!(e.phase, Phase::Generating);
        assert_eq!(e.since_command, ms(72_400));
        assert_eq!(e.check_latency, Some(ms(400)));
        assert_eq!(w.next_check(), NextCheck::Done);
        assert_eq!(w.check_deadline(t0 + ms(200_000)), None, "done watches never expire");
    }

    // Property: health 200 alone is never readiness; a failed generation check
    // sends the watch back to health polling without an event.
    #[test]
    fn failed_generation_keeps_polling_silently() {
        let t0 = Instant::now();
        let mut w = ReadinessWatch::new(t0, ms(10_000));
        assert!(w.observe_health(status(200), t0 + ms(10)).is_some());
        let gen_fail = GenerationObservation::Failed {
            latency: ms(3),
            reason: "GET /health_generate answered 503".into(),
        };
        assert_eq!(w.observe_generation(gen_fail, t0 + ms(13)), None);
        assert_eq!(w.next_check(), NextCheck::Health);
        assert_eq!(w.observe_health(status(200), t0 + ms(30)), None, "still healthy");
        assert_eq!(w.phase(), Phase::Healthy);
    }

    // Property: a health timeout or a failed request on an open port is http_503,
    // and a regression from healthy back to 503 is reported.
    #[test]
    fn timeouts_and_regressions_are_http_503() {
        let t0 = Instant::now();
        let mut w = ReadinessWatch::new(t0, ms(10_000));
        let e = w
            .observe_health(HealthObservation::TimedOut { after: ms(250) }, t0 + ms(250))
            .unwrap();
        assert_eq!(e.phase, Phase::Http503);
        assert_eq!(e.detail, "health timed out after 250 ms");
        w.observe_health(status(200), t0 + ms(300)).unwrap();
        let e = w.observe_health(status(503), t0 + ms(400)).unwrap();
        assert_eq!((e.phase, e.http_status), (Phase::Http503, 503));
    }

    // Property: the deadline yields exactly one not_ready, summarising the last
    // observation (health 200 but generation timing out: INCIDENTS row 3).
    #[test]
    fn deadline_summarises_generation_timeouts() {
        let t0 = Instant::now();
        let mut w = ReadinessWatch::new(t0, ms(20_000));
        assert_eq!(w.check_deadline(t0 + ms(19_999)), None);
        for i in 0..3u64 {
            w.observe_health(status(200), t0 + ms(i * 5_100));
            w.generation_started(t0 + ms(i * 5_100));
            w.observe_generation(
                GenerationObservation::TimedOut { after: ms(5_000) },
                t0 + ms(i * 5_100 + 5_000),
            );
        }
        w.observe_health(status(200), t0 + ms(19_000));
        let e = w.check_deadline(t0 + ms(20_000)).unwrap();
        assert_eq!(e.phase, Phase::NotReady);
        assert_eq!(e.since_command, ms(20_000));
        assert_eq!(
            e.detail,
            "not generating within 20000 ms: health 200 but generation check timed out after 5000 ms, 3 attempts"
        );
        assert_eq!(w.check_deadline(t0 + ms(20_001)), None, "reported once");
        assert_eq!(w.observe_health(status(200), t0 + ms(20_002)), None);
    }

    // Property: a deadline that falls during a generation check or before any
    // answer says so.
    #[test]
    fn deadline_summaries_for_other_situations() {
        let t0 = Instant::now();
        let mut w = ReadinessWatch::new(t0, ms(1_000));
        let e = w.check_deadline(t0 + ms(1_000)).unwrap();
        assert!(e.detail.ends_with("no health check completed"), "{}", e.detail);

        let mut w = ReadinessWatch::new(t0, ms(1_000));
        w.observe_health(refused(), t0 + ms(1));
        w.observe_health(refused(), t0 + ms(21));
        let e = w.check_deadline(t0 + ms(1_000)).unwrap();
        assert!(
            e.detail.contains("last health check: connection refused"),
            "{}",
            e.detail
        );
        assert!(e.detail.contains("2 health polls"), "{}", e.detail);

        let mut w = ReadinessWatch::new(t0, ms(1_000));
        w.observe_health(status(200), t0 + ms(100));
        w.generation_started(t0 + ms(100));
        let e = w.check_deadline(t0 + ms(1_000)).unwrap();
        assert!(
            e.detail
                .ends_with("health 200 but generation check still running after 900 ms"),
            "{}",
            e.detail
        );
    }

    /// A checker whose answers depend only on the (paused) time since `t0`.
    struct Scripted {
        t0: Instant,
        health: fn(Duration) -> HealthObservation,
        generation: fn(Duration) -> (Duration, bool),
        calls: Mutex<Vec<(&'static str, Duration)>>,
    }

    impl Checker for Scripted {
        async fn health(&self) -> HealthObservation {
            let at = self.t0.elapsed();
            self.calls.lock().unwrap().push(("health", at));
            (self.health)(at)
        }
        async fn generation(&self) -> GenerationObservation {
            let at = self.t0.elapsed();
            self.calls.lock().unwrap().push(("generation", at));
            let (latency, ok) = (self.generation)(at);
            tokio::time::sleep(latency).await;
            if ok {
                GenerationObservation::Passed {
                    latency,
                    tokens: 1,
                    detail: "ok".into(),
                }
            } else {
                GenerationObservation::Failed {
                    latency,
                    reason: "no tokens".into(),
                }
            }
        }
    }

    // Property (paused time): the driver polls every poll interval, so each
    // transition is stamped within one interval of when it happened, and the
    // generation check follows a healthy poll immediately.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn driver_detects_transitions_within_one_poll_interval() {
        let t0 = Instant::now();
        let checker = Scripted {
            t0,
            health: |at| match at.as_millis() {
                0..56 => refused(),
                56..72 => status(503),
                _ => status(200),
            },
            generation: |at| (ms(30), at >= ms(100)),
            calls: Mutex::new(Vec::new()),
        };
        let mut events = Vec::new();
        watch(&checker, ReadinessWatch::new(t0, ms(10_000)), ms(20), |c| {
            events.push((c.phase, c.since_command));
            true
        })
        .await;
        assert_eq!(
            events,
            vec![
                (Phase::Refused, ms(0)),
                (Phase::Http503, ms(60)),
                (Phase::Healthy, ms(80)),
                // gen at 80 fails (ends 110), health at 110, gen at 110 passes at 140
                (Phase::Generating, ms(140)),
            ]
        );
        let calls = checker.calls.lock().unwrap().clone();
        assert_eq!(calls[4], ("health", ms(80)));
        assert_eq!(calls[5], ("generation", ms(80)));
        assert_eq!(calls[6], ("health", ms(110)));
        assert_eq!(calls[7], ("generation", ms(110)));
    }

    // Property (paused time): a unit that never generates gets not_ready at
    // exactly the deadline, even while a check is in flight.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn driver_reports_not_ready_at_the_deadline() {
        let t0 = Instant::now();
        let checker = Scripted {
            t0,
            health: |_| status(200),
            generation: |_| (ms(5_000), false),
            calls: Mutex::new(Vec::new()),
        };
        let mut events = Vec::new();
        watch(&checker, ReadinessWatch::new(t0, ms(12_000)), ms(20), |c| {
            events.push(c);
            true
        })
        .await;
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].phase, Phase::Healthy);
        let last = &events[1];
        assert_eq!((last.phase, last.since_command), (Phase::NotReady, ms(12_000)));
        assert!(
            last.detail
                .contains("still running after 2000 ms (2 earlier attempts, last no tokens after 5000 ms)"),
            "{}",
            last.detail
        );
        assert_eq!(Instant::now() - t0, ms(12_000));
    }

    // Property: a superseded watch (emit returns false) stops at once.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn driver_stops_when_superseded() {
        let t0 = Instant::now();
        let checker = Scripted {
            t0,
            health: |at| if at < ms(100) { refused() } else { status(503) },
            generation: |_| (ms(1), true),
            calls: Mutex::new(Vec::new()),
        };
        let mut n = 0;
        watch(&checker, ReadinessWatch::new(t0, ms(10_000)), ms(20), |_| {
            n += 1;
            false
        })
        .await;
        assert_eq!(n, 1);
        assert_eq!(checker.calls.lock().unwrap().len(), 1);
    }

    // Property: zero values of the proto spec mean "default".
    #[test]
    fn params_default_zero_fields() {
        let p = ReadinessParams::from_spec(Some(&ReadinessSpec {
            deadline_ms: 0,
            poll_interval_ms: 50,
            check_timeout_ms: 0,
            chat: Some(ChatProbe {
                model: "m".into(),
                prompt: "p".into(),
                max_tokens: 0,
            }),
        }));
        assert_eq!(p.deadline, ms(DEFAULT_DEADLINE_MS));
        assert_eq!(p.poll_interval, ms(50));
        assert_eq!(p.check_timeout, ms(DEFAULT_CHECK_TIMEOUT_MS));
        assert_eq!(p.health_timeout, ms(MAX_HEALTH_TIMEOUT_MS));
        assert_eq!(p.chat.unwrap().max_tokens, DEFAULT_CHECK_MAX_TOKENS);
        let p = ReadinessParams::from_spec(Some(&ReadinessSpec {
            check_timeout_ms: 300,
            ..Default::default()
        }));
        assert_eq!(p.health_timeout, ms(300));
    }
}
