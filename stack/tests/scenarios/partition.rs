//! Several hosts and network partitions (issue 8), with real network
//! namespaces: the orchestrator in one, host A (prefill and the real
//! sglang-router) in another, host B (decode) in a third, joined by a
//! bridge in a fourth ("switch"). Cutting a host's cable is `ip link set
//! down` on the switch's side of its veth; nothing leaves the namespaces the
//! test made. (`tc netem` needs the kernel's sch_netem, which these
//! machines do not load; a cut link is the partition tested.)
//!
//! Needs root (`ip netns`, bridges, veths); without them the test fails
//! saying so — it never passes without running.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::harness::{Output, bin, exclusive};

const SUBNET: &str = "10.213.7";
const ORCH_IP: &str = "10.213.7.1";
const A_IP: &str = "10.213.7.2";
const B_IP: &str = "10.213.7.3";

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must_ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces and the cables; deleted on drop.
struct Net {
    sw: String,
    orch: String,
    a: String,
    b: String,
}

impl Net {
    /// An error when namespaces, a bridge or veths cannot be made here (no
    /// `ip`, not root, a kernel without bridge/veth); what was made is removed.
    fn create() -> Result<Net, String> {
        let p = format!("pdw{}", std::process::id());
        let net = Net {
            sw: format!("{p}sw"),
            orch: format!("{p}o"),
            a: format!("{p}a"),
            b: format!("{p}b"),
        };
        let try_ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("cannot run ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        // On error `net` is dropped, deleting whatever namespaces exist.
        try_ip(&["netns", "add", &net.sw])?;
        try_ip(&["-n", &net.sw, "link", "add", "br0", "type", "bridge"])?;
        try_ip(&["-n", &net.sw, "link", "set", "br0", "up"])?;
        for (ns, tag, addr) in [(&net.orch, "o", ORCH_IP), (&net.a, "a", A_IP), (&net.b, "b", B_IP)] {
            let port = format!("sw-{tag}");
            try_ip(&["netns", "add", ns])?;
            // Made inside the switch, then one end moved to the host.
            try_ip(&[
                "-n", &net.sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
            ])?;
            try_ip(&["-n", &net.sw, "link", "set", "eth0", "netns", ns])?;
            try_ip(&["-n", &net.sw, "link", "set", &port, "master", "br0"])?;
            try_ip(&["-n", &net.sw, "link", "set", &port, "up"])?;
            try_ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            try_ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            try_ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Unplugs (or plugs back) a host's cable at the switch.
    fn cable(&self, tag: &str, up: bool) {
        must_ip(&[
            "-n",
            &self.sw,
            "link",
            "set",
            &format!("sw-{tag}"),
            if up { "up" } else { "down" },
        ]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.orch, &self.a, &self.b, &self.sw] {
            ip(&["netns", "del", ns]);
        }
    }
}

/// A process in a namespace (`ip netns exec` execs it: same PID), stopped
/// by PID on drop.
struct Proc(Child);

impl Proc {
    fn spawn(ns: &str, program: &Path, args: &[&str], log: &Path) -> Proc {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .spawn()
            .expect("ip netns exec");
        Proc(child)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.0.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Unit processes seen in `status`, killed by PID at the end should their
/// agent not have stopped them (checked to be ours by their command line).
struct Units {
    pids: Vec<u32>,
    marker: String,
}

impl Drop for Units {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&self.marker) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None).is_ok()
}

/// An agent config for `host` on the orchestrator's network, plaintext,
/// stopping its units when it exits, supervising `units` (`[[unit]]` tables).
fn agent_toml(host: &str, state_dir: &std::path::Path, units: &str) -> String {
    format!(
        r#"host = "{host}"
orchestrator = "http://{ORCH_IP}:7070"
insecure_plaintext = true
state_dir = {state:?}
on_exit = "stop-units"

{units}"#,
        state = state_dir.display().to_string(),
    )
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

// Dropped in field order: the agents (stopping their units), the
// orchestrator, any unit left over, then the namespaces.
struct Stack {
    agents: Vec<Proc>,
    _orchestrator: Proc,
    units: Units,
    net: Net,
    dir: tempfile::TempDir,
}

impl Stack {
    fn start(net: Net) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf();
        let smg = root.join(".venv/bin/smg");
        assert!(
            smg.is_file(),
            "{} is missing: run scripts/setup-router.sh",
            smg.display()
        );
        let sim = bin("pd-sim").display().to_string();
        // pd-sim's default start-up at time scale 0.05; decode loads for
        // 10 s (200 s simulated), so a co-restart is reliably inside its
        // decode step when a cable is pulled.
        let engine = |role: &str, host: &str, port: u16, ready_ms: u32| -> Vec<String> {
            let mut v: Vec<String> = [
                sim.as_str(),
                "--role",
                role,
                "--host",
                host,
                "--port",
                &port.to_string(),
                "--model",
                "netns-model",
                "--listen-after-ms",
                "2000",
                "--ready-after-ms",
                &ready_ms.to_string(),
                "--ttft-ms",
                "120",
                "--tpot-ms",
                "12",
                "--time-scale",
                "0.05",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if role == "prefill" {
                v.extend(["--bootstrap-port".to_string(), "8998".to_string()]);
            }
            v
        };
        let router: Vec<String> = [
            smg.display().to_string(),
            "launch".into(),
            "--pd-disaggregation".into(),
            "--prefill".into(),
            format!("http://{A_IP}:30001"),
            "8998".into(),
            "--decode".into(),
            format!("http://{B_IP}:30002"),
            "--host".into(),
            A_IP.into(),
            "--port".into(),
            "30000".into(),
            "--prometheus-port".into(),
            "29001".into(),
            "--log-level".into(),
            "warn".into(),
        ]
        .into();
        let agent_a = agent_toml(
            "host-a",
            &d.join("agent-a"),
            &format!(
                r#"[[unit]]
name = "prefill-0"
role = "prefill"
argv = {prefill}
base_url = "http://{A_IP}:30001"
bootstrap_port = 8998

[[unit]]
name = "router-0"
role = "router"
argv = {router}
base_url = "http://{A_IP}:30000"
health_path = "/readiness"
"#,
                prefill = toml_list(&engine("prefill", A_IP, 30001, 4000)),
                router = toml_list(&router),
            ),
        );
        let agent_b = agent_toml(
            "host-b",
            &d.join("agent-b"),
            &format!(
                r#"[[unit]]
name = "decode-0"
role = "decode"
argv = {decode}
base_url = "http://{B_IP}:30002"
"#,
                decode = toml_list(&engine("decode", B_IP, 30002, 200_000)),
            ),
        );
        let orchestrator = format!(
            r#"listen = "0.0.0.0:7070"
journal = {journal:?}
insecure_plaintext = true
resume_grace_ms = 20000

[[pair]]
name = "xpair"
prefill = [{{ host = "host-a", unit = "prefill-0" }}]
decode = [{{ host = "host-b", unit = "decode-0" }}]
router = [{{ host = "host-a", unit = "router-0" }}]

[pair.probe]
model = "netns-model"
prompt = "pdwarden readiness probe: reply with one word."
warm_budget_ms = 1000
cold_allowance_ms = 5000
probe_timeout_ms = 10000
warm_probes = 2
max_probes = 5

[pair.watch]
auto_recover = true

[pair.timeouts]
prefill_ready_ms = 60000
decode_ready_ms = 60000
router_ready_ms = 30000
stop_grace_ms = 5000
poll_interval_ms = 20
check_timeout_ms = 5000
"#,
            journal = d.join("journal.sqlite").display().to_string(),
        );
        for (name, text) in [
            ("agent-a.toml", &agent_a),
            ("agent-b.toml", &agent_b),
            ("orchestrator.toml", &orchestrator),
        ] {
            std::fs::write(d.join(name), text).unwrap();
        }
        let cfg = |n: &str| d.join(n).display().to_string();
        let orch = Proc::spawn(
            &net.orch,
            &bin("pdwarden-orchestrator"),
            &["--config", &cfg("orchestrator.toml")],
            &d.join("orchestrator.log"),
        );
        let agents = vec![
            Proc::spawn(
                &net.a,
                &bin("pdwarden-agent"),
                &["--config", &cfg("agent-a.toml")],
                &d.join("agent-a.log"),
            ),
            Proc::spawn(
                &net.b,
                &bin("pdwarden-agent"),
                &["--config", &cfg("agent-b.toml")],
                &d.join("agent-b.log"),
            ),
        ];
        let stack = Stack {
            agents,
            _orchestrator: orch,
            // Every unit's command line names an address of this test's subnet.
            units: Units {
                pids: Vec::new(),
                marker: format!("{SUBNET}."),
            },
            net,
            dir,
        };
        stack.wait_for("both agents attached", Duration::from_secs(30), |s| {
            states(s) == ["connected", "connected"]
        });
        stack
    }

    /// `pdwarden ARGS` run inside the orchestrator's namespace.
    fn cli(&self, args: &[&str], limit: Duration) -> Output {
        let mut full = vec!["netns", "exec", &self.net.orch];
        let exe = bin("pdwarden").display().to_string();
        full.push(&exe);
        full.extend(["--orchestrator", "http://127.0.0.1:7070"]);
        full.extend_from_slice(args);
        let mut child = Command::new("ip")
            .args(&full)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let o = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let e = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + limit;
        let code = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pdwarden {args:?} ran past {limit:?}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            code,
            stdout: o.join().unwrap(),
            stderr: e.join().unwrap(),
        }
    }

    fn status(&self) -> Value {
        let out = self.cli(&["status", "--json"], Duration::from_secs(20));
        assert_eq!(out.code, 0, "status: {}", out.stderr);
        out.json()
    }

    /// Polls `status` until `cond` holds; an orchestrator not yet listening
    /// counts as "not yet".
    fn wait_for(&self, what: &str, limit: Duration, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.cli(&["status", "--json"], Duration::from_secs(20));
            let last = if out.code == 0 {
                let s = out.json();
                if cond(&s) {
                    return s;
                }
                format!("{s:#}")
            } else {
                out.stderr
            };
            assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; last status: {last}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The tails of every log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for name in [
            "orchestrator.log",
            "orchestrator.err",
            "agent-a.log",
            "agent-a.err",
            "agent-b.log",
            "agent-b.err",
        ] {
            let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {name}\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// One generation through the router, sent from inside host A's
    /// namespace (a thread that joins it): does the pair still serve?
    fn generate_through_router(&self) -> Result<String, String> {
        let ns = self.net.a.clone();
        std::thread::spawn(move || -> Result<String, String> {
            let f = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
            let body = r#"{"model":"netns-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
            let mut s = std::net::TcpStream::connect((A_IP, 30000)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {A_IP}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .map_err(|e| e.to_string())?;
            let mut reply = String::new();
            s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
            Ok(reply)
        })
        .join()
        .unwrap()
    }
}

fn states(s: &Value) -> Vec<String> {
    let mut agents: Vec<(String, String)> = s["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["host"].as_str().unwrap_or("").to_string(),
                a["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    agents.sort();
    agents.into_iter().map(|(_, st)| st).collect()
}

/// `host/unit` → pid, for every unit with a process.
fn unit_pids(s: &Value) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for a in s["agents"].as_array().into_iter().flatten() {
        for u in a["units"].as_array().into_iter().flatten() {
            if let Some(pid) = u["pid"].as_u64() {
                out.push((
                    format!("{}/{}", a["host"].as_str().unwrap(), u["name"].as_str().unwrap()),
                    pid as u32,
                ));
            }
        }
    }
    out.sort();
    out
}

fn pid_of(s: &Value, unit: &str) -> Option<u32> {
    unit_pids(s)
        .into_iter()
        .find(|(u, _)| u.ends_with(unit))
        .map(|(_, p)| p)
}

/// The orchestrator is cut off from both hosts while the pair serves, and
/// later host B (decode) is cut off in the middle of a co-restart:
/// - cut off, the units keep running untouched (same PIDs), the pair keeps
///   serving through the router, the agents become `unknown`/`disconnected`
///   and nothing restarts anything — not the orchestrator's watch (it has
///   `auto_recover` on), not the agents on their own;
/// - healed, the agents re-attach and report the same processes;
/// - the co-restart in flight when host B went away is concluded `failed`
///   naming the lost agent, never healthy; B's agent did not restart its
///   decode on its own; after healing, a new co-restart is healthy.
#[test]
fn partitions_leave_units_running_and_end_operations_honestly() {
    let _one = exclusive();
    // Never green without running (issue 33): a host that cannot build the
    // namespaces fails here, saying why.
    assert!(
        nix::unistd::geteuid().is_root(),
        "the partitions scenario needs root for `ip netns` (this run is not root)"
    );
    let net =
        Net::create().unwrap_or_else(|why| panic!("the partitions scenario cannot build its namespaces here: {why}"));
    let mut stack = Stack::start(net);
    let long = Duration::from_secs(120);

    // 1. A pair across two hosts: prefill and router on A, decode on B.
    let out = stack.cli(&["restart", "pd-pair", "xpair", "--json"], long);
    let report = out.json();
    assert_eq!(out.code, 0, "{report:#}\n{}", stack.logs());
    assert!(report["verdict"].as_str().unwrap().starts_with("healthy"), "{report:#}");
    let before = stack.status();
    let pids = unit_pids(&before);
    assert_eq!(pids.len(), 3, "{before:#}");
    stack.units.pids.extend(pids.iter().map(|(_, p)| *p));
    assert!(stack.generate_through_router().unwrap().starts_with("HTTP/1.1 200"));

    // 2. The orchestrator's cable is pulled.
    stack.net.cable("o", false);
    let cut = Instant::now();
    stack.wait_for("both agents no longer connected", Duration::from_secs(45), |s| {
        states(s).iter().all(|st| st == "unknown" || st == "disconnected")
    });
    // Both sides have given up on the stream by now (pings every 10 s,
    // 5 s to answer); hold the partition a little longer regardless.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(cut.elapsed()));
    for (unit, pid) in &pids {
        assert!(alive(*pid), "{unit} (pid {pid}) died during the partition");
    }
    let reply = stack.generate_through_router().expect("router reachable inside host A");
    assert!(
        reply.starts_with("HTTP/1.1 200"),
        "the pair stopped serving while the control plane was cut off: {reply}"
    );
    let during = stack.status();
    assert!(
        during["pairs"][0]["running_operation"].is_null(),
        "an operation started during the partition: {during:#}"
    );

    // 3. Healed: the same processes, re-reported; nothing was restarted.
    stack.net.cable("o", true);
    let after = stack.wait_for("both agents re-attached", Duration::from_secs(45), |s| {
        states(s) == ["connected", "connected"]
    });
    assert_eq!(unit_pids(&after), pids, "units changed across the partition");
    let history = stack
        .cli(&["history", "xpair", "--json"], Duration::from_secs(20))
        .json();
    assert_eq!(
        history.as_array().unwrap().len(),
        1,
        "only the first restart: nothing ran on its own: {history:#}"
    );

    // 4. A co-restart, and host B's cable pulled while its decode loads.
    let old_decode = pid_of(&after, "decode-0").unwrap();
    let exe = bin("pdwarden").display().to_string();
    let mut restart = Command::new("ip")
        .args(["netns", "exec", &stack.net.orch, &exe])
        .args([
            "--orchestrator",
            "http://127.0.0.1:7070",
            "restart",
            "pd-pair",
            "xpair",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let restarting = stack.wait_for("the decode restarted by the co-restart", long, |s| {
        pid_of(s, "decode-0").is_some_and(|p| p != old_decode)
    });
    let new_decode = pid_of(&restarting, "decode-0").unwrap();
    stack.units.pids.extend(unit_pids(&restarting).iter().map(|(_, p)| *p));
    stack.net.cable("b", false);
    let deadline = Instant::now() + long;
    let code = loop {
        if let Some(st) = restart.try_wait().unwrap() {
            break st.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = restart.kill();
            let _ = restart.wait();
            panic!(
                "the co-restart did not conclude while host B was cut off\n{}",
                stack.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    restart.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let report: Value = serde_json::from_str(stdout.lines().rev().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["verdict"], "failed", "{report:#}");
    let reasons = report["reasons"].to_string();
    assert!(
        reasons.contains("host-b") && reasons.contains("disconnected"),
        "{reasons}"
    );
    // Cut off, B's agent keeps the decode it was loading and starts nothing.
    assert!(
        alive(new_decode),
        "decode pid {new_decode} died while host B was cut off"
    );

    // 5. Healed: B's agent re-attaches with the same decode process, and a
    //    new co-restart brings the pair back.
    stack.net.cable("b", true);
    let healed = stack.wait_for("host B re-attached", Duration::from_secs(45), |s| {
        states(s) == ["connected", "connected"]
    });
    assert_eq!(pid_of(&healed, "decode-0"), Some(new_decode), "{healed:#}");
    let out = stack.cli(&["restart", "pd-pair", "xpair", "--json"], long);
    let report = out.json();
    assert_eq!(out.code, 0, "{report:#}\n{}", stack.logs());
    assert!(report["verdict"].as_str().unwrap().starts_with("healthy"), "{report:#}");
    stack
        .units
        .pids
        .extend(unit_pids(&stack.status()).iter().map(|(_, p)| *p));
    let history = stack
        .cli(&["history", "xpair", "--json"], Duration::from_secs(20))
        .json();
    let verdicts: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["verdict"].as_str().unwrap_or("running"))
        .collect();
    assert_eq!(verdicts.len(), 3, "{history:#}");
    assert_eq!(verdicts[1], "failed", "{history:#}");
    // Agents stop their units (on_exit = "stop-units") as the stack drops.
    stack.agents.clear();
}
