//! systemd's notify protocol (`Type=notify`, `WatchdogSec=`), through the
//! `sd-notify` crate: `READY=1` once the agent supervises (its units
//! adopted or started, its metrics endpoint bound), and `WATCHDOG=1` while
//! the supervisor still answers.
//!
//! The ping is not a timer that proves only that the runtime runs: each one
//! first asks the supervisor for its units (the lock every command and
//! event takes). A supervisor stuck on that lock stops the pings, and
//! systemd restarts the agent after `WatchdogSec` — which, with
//! `KillMode=process`, leaves the engines serving for the next agent to
//! adopt. Without `NOTIFY_SOCKET` (not under systemd) all of this is a
//! no-op.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::AbortHandle;

use crate::supervisor::Supervisor;

/// Says `READY=1`; with a watchdog configured, pings it at half its
/// interval from a task (returned, for the caller to stop) while the
/// supervisor answers within that half.
pub(crate) fn ready_and_watch(supervisor: Arc<Supervisor>) -> Option<AbortHandle> {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status("supervising")]) {
        tracing::warn!(error = %e, "cannot tell the service manager the agent is ready");
    }
    let interval = sd_notify::watchdog_enabled()?;
    let half = interval / 2;
    tracing::info!(watchdog = ?interval, "pinging the service manager's watchdog");
    Some(
        tokio::spawn(async move {
            let mut every = tokio::time::interval(half.max(Duration::from_millis(100)));
            loop {
                every.tick().await;
                let s = Arc::clone(&supervisor);
                let answered = tokio::time::timeout(half, tokio::task::spawn_blocking(move || s.unit_infos().len())).await;
                match answered {
                    Ok(Ok(_)) => {
                        if let Err(e) = sd_notify::notify(&[NotifyState::Watchdog]) {
                            tracing::warn!(error = %e, "cannot ping the service manager's watchdog");
                        }
                    }
                    _ => tracing::error!(
                        within = ?half,
                        "the supervisor did not answer: not pinging the watchdog (systemd restarts the agent; the engines keep running)"
                    ),
                }
            }
        })
        .abort_handle(),
    )
}
