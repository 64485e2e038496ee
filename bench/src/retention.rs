//! A year of a fleet's journal (issue 36): `simulate_year` (the
//! orchestrator's own, also run by the journal's contract test at a smaller
//! scale) writes 50 pairs × a co-restart an hour for 365 simulated days into
//! a real SQLite journal, the retention pass once a simulated day, and
//! reports the journal's size at the end, each pass's time, and
//! `history PAIR` (the CLI's 20) latency. Opt-in (`--only retention`): it
//! writes ~3.5 million records.

use pdwarden_orchestrator::ops::journal::{Journal, JournalSize, RetentionPolicy, simulate_year};

pub struct Year {
    pub pairs: u32,
    pub every_hours: i64,
    pub written: u64,
    pub size: JournalSize,
    pub pass_ms: Vec<f64>,
    pub history_ms: Vec<f64>,
    pub took_s: f64,
    pub policy: RetentionPolicy,
}

pub fn run(pairs: u32, every_hours: i64) -> anyhow::Result<Year> {
    let dir = tempfile::tempdir()?;
    let journal = Journal::open(&dir.path().join("journal.sqlite"))?;
    let policy = RetentionPolicy::default();
    let started = tokio::time::Instant::now();
    let run = simulate_year(&journal, &policy, pairs, every_hours, 1)?;
    let took_s = started.elapsed().as_secs_f64();
    let mut history_ms = Vec::new();
    for p in 0..pairs {
        for _ in 0..20 {
            let t = tokio::time::Instant::now();
            journal.history(&format!("pair-{p}"), 20)?;
            history_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(Year {
        pairs,
        every_hours,
        written: run.written,
        size: journal.size()?,
        pass_ms: run.pass_ms,
        history_ms,
        took_s,
        policy,
    })
}
