//! systemd's notify protocol (`Type=notify`, `WatchdogSec=`), through the
//! `sd-notify` crate: `READY=1` once the orchestrator serves (TLS loaded,
//! the journal open and owned, interrupted operations resumed, the gRPC
//! listener bound), and `WATCHDOG=1` while the journal still answers.
//!
//! Each ping first reads the journal (the lock every operation's step
//! takes): an orchestrator whose journal is stuck cannot step any
//! operation, and systemd restarting it is the fix — the next one resumes
//! the operations from the journal. Without `NOTIFY_SOCKET` (not under
//! systemd) this is a no-op.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::AbortHandle;

use crate::ops::journal::Journal;

/// Says `READY=1`; with a watchdog configured, pings it at half its
/// interval from a task (returned, for the caller to stop) while the
/// journal answers within that half.
pub fn ready_and_watch(journal: Arc<Journal>) -> Option<AbortHandle> {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status("serving")]) {
        tracing::warn!(error = %e, "cannot tell the service manager the orchestrator is ready");
    }
    let interval = sd_notify::watchdog_enabled()?;
    let half = interval / 2;
    tracing::info!(watchdog = ?interval, "pinging the service manager's watchdog");
    let task = tokio::spawn(async move {
        let mut every = tokio::time::interval(half.max(Duration::from_millis(100)));
        loop {
            every.tick().await;
            let j = Arc::clone(&journal);
            match tokio::time::timeout(half, tokio::task::spawn_blocking(move || j.ping())).await {
                Ok(Ok(Ok(()))) => {
                    if let Err(e) = sd_notify::notify(&[NotifyState::Watchdog]) {
                        tracing::warn!(error = %e, "cannot ping the service manager's watchdog");
                    }
                }
                Ok(Ok(Err(e))) => {
                    tracing::error!(error = %e, "the journal cannot be read: not pinging the watchdog")
                }
                _ => tracing::error!(within = ?half, "the journal did not answer: not pinging the watchdog"),
            }
        }
    });
    Some(task.abort_handle())
}
