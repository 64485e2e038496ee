//! A journal that cannot be written, on a real filesystem that fills
//! (issue 32; issue 31's "a co-restart stopped after the prefill → repaired
//! by the watch"): the orchestrator's journal on a tmpfs this test mounts,
//! filled while an operation runs. Write-ahead is must-write (DESIGN.md 17):
//! the operation stops before it sends a command it cannot record, says
//! exactly what is live, and once space returns the watch repairs what the
//! stop left half-done. Needs root (`mount -t tmpfs`): the test fails
//! saying so where it cannot mount, it never passes without running.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::{HeldDemo, exclusive, poll, reasons};

const LIMIT: Duration = Duration::from_secs(180);

/// A tmpfs mounted for the test, unmounted when dropped.
pub struct SmallFs {
    pub dir: tempfile::TempDir,
    filler: Option<PathBuf>,
}

impl SmallFs {
    pub fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this scenario needs root to mount a tmpfs for the journal (`mount -t tmpfs`): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        SmallFs { dir, filler: None }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Fills the filesystem to the last byte.
    pub fn fill(&mut self) {
        let path = self.path("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        // Bounded: the filesystem is small.
        for _ in 0..100_000 {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        let byte = [0u8; 1];
        while f.write_all(&byte).is_ok() {}
        let _ = f.sync_all();
        self.filler = Some(path);
    }

    /// Frees what [`SmallFs::fill`] took.
    pub fn free(&mut self) {
        if let Some(p) = self.filler.take() {
            std::fs::remove_file(p).unwrap();
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// A held demo whose journal is on `fs`, healthy and watched (`extra`:
/// more demo flags).
fn held_on(fs: &SmallFs, extra: &[&str]) -> HeldDemo {
    let journal = fs.path("journal.sqlite");
    let mut args = vec!["--journal", journal.to_str().unwrap()];
    args.extend_from_slice(extra);
    let held = HeldDemo::start(&args, LIMIT);
    assert!(
        held.report["verdict"].as_str().unwrap().starts_with("healthy"),
        "{:#}",
        held.report
    );
    poll("watch healthy after the restart", Duration::from_secs(60), || {
        (held.watch()["state"] == "healthy").then_some(())
    });
    held
}

/// Runs the CLI with `args` and fills `fs` once the prefill's process
/// `prefill` is gone (its start was journaled), before anything after it.
fn fill_once_the_prefill_is_replaced(
    held: &HeldDemo,
    fs: &mut SmallFs,
    prefill: u32,
    args: &[&str],
) -> crate::harness::Output {
    std::thread::scope(|s| {
        let cli = s.spawn(|| held.cli_within(args, LIMIT));
        let deadline = Instant::now() + LIMIT;
        while !gone(prefill) {
            assert!(Instant::now() < deadline, "the prefill was never restarted");
            std::thread::sleep(Duration::from_millis(5));
        }
        fs.fill();
        cli.join().unwrap()
    })
}

#[test]
fn a_co_restart_whose_journal_fills_stops_before_the_decode_says_what_is_live_and_the_watch_repairs_it() {
    let _one = exclusive();
    let mut fs = SmallFs::mount("16m");
    let held = held_on(&fs, &[]);
    let prefill = held.unit_pid("prefill-0");
    let decode = held.unit_pid("decode-0");

    // The operator's co-restart; the filesystem fills once the prefill's
    // old process is gone, before the decode's start.
    let restart = fill_once_the_prefill_is_replaced(&held, &mut fs, prefill, &["restart", "pd-pair", "demo", "--json"]);
    assert_eq!(restart.code, 2, "{}\n{}", restart.stdout, restart.stderr);
    let report = restart.json();
    let said = reasons(&report);
    assert!(report["verdict"] == "failed", "{report:#}");
    assert!(
        said.starts_with("stopped: the journal could not record a step"),
        "the journal named first: {said}"
    );
    assert!(
        said.contains("the journal could not record this conclusion"),
        "the unwritten conclusion said: {said}"
    );
    assert!(
        said.contains("restarted by this operation (new processes): prefill-0"),
        "what is live: {report:#}"
    );
    assert!(
        said.contains("decode-0 still holds the bootstrap of prefill-0's old process"),
        "the half-done pair named: {report:#}"
    );
    assert_eq!(held.unit_pid("decode-0"), decode, "no decode start went out unrecorded");
    assert_ne!(held.unit_pid("prefill-0"), prefill);

    // Space returns: the pending conclusion is written and the watch
    // repairs the pair the stop left half-done (every KV transfer fails).
    fs.free();
    let (_, auto) = held.automatic_recovery(LIMIT);
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    assert!(
        auto["verdict"].as_str().unwrap_or("").starts_with("healthy"),
        "{auto:#}"
    );
    assert_ne!(held.unit_pid("decode-0"), decode, "the decode was co-restarted");
    let history = held.cli(&["history", "demo", "--json"]).json();
    let stopped = history
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["operation_id"] == report["operation_id"])
        .unwrap_or_else(|| panic!("the stopped co-restart is in the history: {history:#}"));
    assert_eq!(
        stopped["verdict"], "failed",
        "its conclusion was written once space returned: {stopped:#}"
    );
    println!(
        "journal full mid co-restart → {} ({}); freed → automatic {} recovery {}",
        report["verdict"], report["reasons"][0], auto["trigger"]["wedge"]["kind"], auto["verdict"]
    );
}

/// `settings.knob_live` of each engine, from pd-sim itself.
fn knob_live(held: &HeldDemo) -> Vec<bool> {
    ["prefill-0", "decode-0"]
        .iter()
        .map(|u| {
            let url = held.unit_url(u);
            let stats: serde_json::Value = tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async { reqwest::get(format!("{url}/sim/stats")).await?.json().await })
                .unwrap();
            stats["settings"]["knob_live"].as_bool().unwrap()
        })
        .collect()
}

/// The gate's half (issue 32's first finding): the journal fills once the
/// gate's co-restart onto the knob has replaced the prefill. Before, the
/// gate said "FAILED: nothing was changed" with the knob live in the
/// prefill and current in both units' config (the next plain restart
/// started both with it). Now it rolls back what it can without a journal
/// (the config versions), says which process runs the change, and once
/// space returns the watch's co-restart starts both engines on the
/// previous version: nothing is left half-done.
#[test]
fn a_gate_whose_journal_fills_rolls_back_says_what_runs_the_change_and_ends_with_nothing_live() {
    let _one = exclusive();
    let mut fs = SmallFs::mount("16m");
    let knob = "--tpot-ms 24 --knob-env PDW_KNOB --knob-value on --knob-slowdown 1.0";
    let held = held_on(&fs, &["--prefill-sim", knob, "--decode-sim", knob]);
    let prefill = held.unit_pid("prefill-0");
    let gate = fill_once_the_prefill_is_replaced(
        &held,
        &mut fs,
        prefill,
        &["gate", "demo", "--set-env", "PDW_KNOB=on", "--json"],
    );
    let report = gate.json();
    let said = reasons(&report);
    println!("gate with its journal full:\n{said}");
    assert_eq!(report["verdict"], "rollback_failed", "{report:#}");
    assert!(
        said.starts_with("stopped: the journal could not record a step"),
        "{said}"
    );
    assert!(!said.contains("nothing was changed"), "{said}");
    assert!(
        said.contains("rolled back: the previous config versions are current again"),
        "{said}"
    );
    assert!(said.contains("prefill-0 runs the change"), "{said}");
    assert_eq!(
        knob_live(&held),
        [true, false],
        "pd-sim's own view: the prefill alone has the knob"
    );

    // Space returns: the watch repairs the half-done pair, and its
    // co-restart starts both on the previous config.
    fs.free();
    let (_, auto) = held.automatic_recovery(LIMIT);
    assert_eq!(auto["trigger"]["automatic"], true, "{auto:#}");
    assert!(
        auto["verdict"].as_str().unwrap_or("").starts_with("healthy"),
        "{auto:#}"
    );
    assert_eq!(knob_live(&held), [false, false], "nothing of the change is live");
    let history = held.cli(&["history", "demo", "--json"]).json();
    let concluded = history
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["operation_id"] == report["operation_id"])
        .unwrap_or_else(|| panic!("the gate is in the history: {history:#}"));
    assert_eq!(concluded["verdict"], "rollback_failed", "{concluded:#}");
    println!(
        "journal full mid-gate → {}; freed → automatic {} recovery {}, knob live {:?}",
        report["verdict"],
        auto["trigger"]["wedge"]["kind"],
        auto["verdict"],
        knob_live(&held)
    );
}
