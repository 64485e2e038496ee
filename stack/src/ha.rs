//! The local stack with a highly available control plane (issue 19): a real
//! etcd cluster (Debian's `etcd-server`, three members on loopback), three
//! orchestrators on it (one leads, two follow), and the agent attached to
//! whichever leads, given all three.
//!
//! Built on the ordinary stack's configs ([`write_configs`]): the same pair,
//! engines, router and certificates; only the journal (`etcd:`), the
//! leadership and the agent's orchestrator list differ. Every process is
//! owned here and stopped by PID.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pdwarden_client::{Connection, Credentials};
use pdwarden_orchestrator::config::{JournalSpec, LeadershipConfig};
use pdwarden_orchestrator::edge::ports::late_bind_port;
use serde_json::Value;

use crate::args::DemoArgs;
use crate::drill::{CrashAt, reached, spawned_more_than_once, spawns_since};
use crate::plan::{PAIR, StackPlan, write_configs};
use crate::process::{Owned, binary, spawn_logged};

/// The etcd server binary: `PDWARDEN_ETCD`, else `etcd` on the PATH
/// (`scripts/setup-etcd.sh` installs Debian's `etcd-server`).
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("PDWARDEN_ETCD") {
        return Ok(PathBuf::from(p));
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("etcd");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("etcd not found: run scripts/setup-etcd.sh (Debian's etcd-server), or set PDWARDEN_ETCD")
}

/// One etcd member.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Owned>,
}

/// A real etcd cluster on loopback, in a directory of its own.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    token: String,
}

const ETCD_LOG_NAMES: [&str; 5] = ["etcd-0", "etcd-1", "etcd-2", "etcd-3", "etcd-4"];

impl EtcdCluster {
    /// Starts `n` (1 to 5) members and waits until the cluster answers.
    pub async fn start(dir: &Path, n: usize) -> anyhow::Result<Self> {
        anyhow::ensure!((1..=5).contains(&n), "an etcd cluster of 1 to 5 members");
        let members = (0..n)
            .map(|i| {
                Ok(Member {
                    name: format!("m{i}"),
                    client_port: late_bind_port()?,
                    peer_port: late_bind_port()?,
                    process: None,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut cluster = Self {
            members,
            dir: dir.to_path_buf(),
            token: format!("pdwarden-{}", uuid::Uuid::new_v4()),
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_healthy(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let args: Vec<String> = [
            "--name",
            &m.name,
            "--data-dir",
            &self.dir.join(format!("etcd-{}", m.name)).display().to_string(),
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &initial.join(","),
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            &self.token,
            // Loopback: elect in ~1 s, the floor of a 2 s lease.
            "--heartbeat-interval",
            "100",
            "--election-timeout",
            "1000",
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process = spawn_logged(ETCD_LOG_NAMES[i], &etcd_binary()?, &args, &self.dir)?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// The members' client URLs.
    pub fn client_urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// SIGKILLs member `i` (its data dir stays).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGKILL);
            p.stop(Duration::from_secs(5));
        }
    }

    /// Starts member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// Waits until a live member says the cluster is healthy (it has a
    /// quorum: etcd answers `/health` true only then).
    pub async fn wait_healthy(&self, limit: Duration) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + limit;
        let mut last = String::from("no member answered");
        while Instant::now() < deadline {
            for m in self.members.iter().filter(|m| m.process.is_some()) {
                let url = format!("http://127.0.0.1:{}/health", m.client_port);
                match http.get(&url).timeout(Duration::from_secs(2)).send().await {
                    Ok(r) => {
                        let body: Value = r.json().await.unwrap_or(Value::Null);
                        if body["health"] == "true" {
                            return Ok(());
                        }
                        last = format!("{url}: {body}");
                    }
                    Err(e) => last = format!("{url}: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the etcd cluster was not healthy within {limit:?}: {last}")
    }
}

/// One orchestrator of the HA stack.
pub struct HaOrchestrator {
    pub url: String,
    pub connection: Connection,
    config: PathBuf,
    process: Option<Owned>,
    log_name: &'static str,
    /// SIGSTOPped ([`HaStack::pause_orchestrator`]): not asked anything.
    paused: bool,
}

const ORCH_LOG_NAMES: [&str; 3] = ["orchestrator-0", "orchestrator-1", "orchestrator-2"];

/// The HA local stack: etcd, three orchestrators, the agent and its units.
// Fields drop in order: the agent (and its units) first, then the
// orchestrators, then etcd, then the directory.
pub struct HaStack {
    agent: Owned,
    pub orchestrators: Vec<HaOrchestrator>,
    pub etcd: EtcdCluster,
    pub dir: tempfile::TempDir,
    pub plan: StackPlan,
    /// The agent's state dir (its `fencing_token` file).
    pub agent_state_dir: PathBuf,
    /// How many units the agent registers.
    pub units: usize,
}

impl HaStack {
    /// Starts etcd, three orchestrators with a `lease_ttl_s` lease, and the
    /// agent; waits until one leads with the agent's units attached.
    pub async fn start(args: &DemoArgs, given: Credentials, lease_ttl_s: u64) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("pdwarden-ha-").tempdir()?;
        let configs = write_configs(args, dir.path())?;
        let etcd = EtcdCluster::start(dir.path(), 3).await?;
        let credentials = configs.credentials.clone().unwrap_or(given);
        let scheme = if configs.url.starts_with("https") {
            "https"
        } else {
            "http"
        };
        let mut orchestrators = Vec::new();
        let mut urls = Vec::new();
        for (i, log_name) in ORCH_LOG_NAMES.iter().enumerate() {
            let port = if i == 0 {
                configs.orchestrator.listen.port()
            } else {
                late_bind_port()?
            };
            let url = format!("{scheme}://127.0.0.1:{port}");
            let mut c = configs.orchestrator.clone();
            c.listen = format!("127.0.0.1:{port}").parse()?;
            c.journal = JournalSpec::Etcd(etcd.client_urls());
            let mut l = LeadershipConfig::new(&url);
            l.lease_ttl_s = lease_ttl_s;
            l.etcd_timeout_ms = 1_000.min(lease_ttl_s * 1000 / 2);
            c.leadership = Some(l);
            // One readiness endpoint is enough (the first's); the others
            // would collide on its port.
            if i > 0 {
                c.readiness_listen = None;
            }
            let path = dir.path().join(format!("orchestrator-{i}.toml"));
            std::fs::write(&path, c.to_toml_string()?)?;
            // Read back through the loader, as an operator's file is.
            pdwarden_orchestrator::config::OrchestratorConfig::load(&path)?;
            orchestrators.push(HaOrchestrator {
                connection: Connection::new(url.clone(), credentials.clone()),
                url: url.clone(),
                config: path,
                process: None,
                log_name,
                paused: false,
            });
            urls.push(url);
        }
        let mut agent_config = configs.agent.clone();
        agent_config.orchestrator = urls.clone().into();
        std::fs::write(&configs.agent_path, toml_of(&agent_config)?)?;
        pdwarden_agent::AgentConfig::load(&configs.agent_path).context("the HA agent config reads back")?;
        let mut stack = Self {
            agent: spawn_logged(
                "agent",
                &binary("pdwarden-agent")?,
                &["--config".into(), configs.agent_path.display().to_string()],
                dir.path(),
            )?,
            orchestrators,
            etcd,
            agent_state_dir: configs.agent.state_dir.clone(),
            units: configs.agent.units.len(),
            dir,
            plan: configs.plan,
        };
        for i in 0..stack.orchestrators.len() {
            stack.start_orchestrator(i)?;
        }
        stack
            .wait_leader_with_agent(stack.units, Duration::from_secs(60))
            .await?;
        Ok(stack)
    }

    /// Starts orchestrator `i` (again), as its service manager would.
    pub fn start_orchestrator(&mut self, i: usize) -> anyhow::Result<u32> {
        let o = &mut self.orchestrators[i];
        let p = spawn_logged(
            o.log_name,
            &binary("pdwarden-orchestrator")?,
            &["--config".into(), o.config.display().to_string()],
            self.dir.path(),
        )?;
        let pid = p.pid();
        o.process = Some(p);
        Ok(pid)
    }

    /// SIGSTOPs orchestrator `i`: frozen as a paused VM, a long stall or a
    /// host cut off without a reset would leave it — its sockets open, its
    /// lease running out, itself believing it leads. Not asked anything
    /// until [`HaStack::resume_orchestrator`].
    pub fn pause_orchestrator(&mut self, i: usize) -> Option<u32> {
        let pid = self.orchestrators[i].process.as_ref()?.pid();
        kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).ok()?;
        self.orchestrators[i].paused = true;
        Some(pid)
    }

    /// SIGCONTs a paused orchestrator `i`.
    pub fn resume_orchestrator(&mut self, i: usize) {
        if let Some(p) = &self.orchestrators[i].process {
            let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGCONT);
        }
        self.orchestrators[i].paused = false;
    }

    /// Whether orchestrator `i` runs and is not paused.
    fn answering(&self, i: usize) -> bool {
        let o = &self.orchestrators[i];
        !o.paused && o.process.as_ref().is_some_and(|p| !exited(p.pid()))
    }

    /// SIGKILLs orchestrator `i`; its pid.
    pub fn kill_orchestrator(&mut self, i: usize) -> Option<u32> {
        let mut p = self.orchestrators[i].process.take()?;
        let pid = p.pid();
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        p.stop(Duration::from_secs(5));
        Some(pid)
    }

    /// SIGTERMs orchestrator `i` (a planned stop) and waits for it to exit
    /// (at most `limit`, then SIGKILL); its exit status.
    pub fn terminate_orchestrator(&mut self, i: usize, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut p = self.orchestrators[i].process.take()?;
        let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(s) = p.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = kill(Pid::from_raw(p.pid() as i32), Signal::SIGKILL);
        p.stop(Duration::from_secs(5));
        None
    }

    /// Whether orchestrator `i`'s process is still running (a deposed one
    /// exits on its own); reaps it if it ended, with its exit status.
    pub fn orchestrator_exited(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let p = self.orchestrators[i].process.as_mut()?;
        let status = p.try_wait()?;
        self.orchestrators[i].process = None;
        Some(status)
    }

    /// The text orchestrator `i` logged so far.
    pub fn orchestrator_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.orchestrators[i].log_name)))
            .unwrap_or_default()
    }

    /// `status --json` of orchestrator `i`, if it answers.
    pub async fn status(&self, i: usize) -> Option<Value> {
        let mut c = self.orchestrators[i].connection.connect().await.ok()?;
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            c.status(pdwarden_proto::v1::StatusRequest::default()),
        )
        .await
        .ok()?
        .ok()?;
        serde_json::from_str(&r.into_inner().json).ok()
    }

    /// The orchestrator that says it leads, with its fencing token.
    pub async fn leader(&self) -> Option<(usize, u64)> {
        for i in 0..self.orchestrators.len() {
            if !self.answering(i) {
                continue;
            }
            if let Some(s) = self.status(i).await
                && s["leadership"]["role"] == "leader"
            {
                return Some((i, s["leadership"]["token"].as_u64().unwrap_or(0)));
            }
        }
        None
    }

    /// Waits until some orchestrator leads with the agent attached and its
    /// `units` registered; (index, token).
    pub async fn wait_leader_with_agent(&self, units: usize, limit: Duration) -> anyhow::Result<(usize, u64)> {
        let deadline = Instant::now() + limit;
        let mut last = "no orchestrator leads yet".to_string();
        while Instant::now() < deadline {
            // One that exited (deposed: a leader that lost etcd exits on
            // purpose) is passed over; when none is left — all exited at
            // start (a build without etcd, a bad config) — no use waiting:
            // the last one's log says why.
            let live: Vec<usize> = (0..self.orchestrators.len()).filter(|i| self.answering(*i)).collect();
            if live.is_empty() {
                let i = self.orchestrators.len() - 1;
                bail!(
                    "no orchestrator is running (and not paused); orchestrator {i} said: {}",
                    self.orchestrator_log(i).lines().last().unwrap_or("(no log)")
                );
            }
            for i in live {
                let Some(s) = self.status(i).await else { continue };
                if s["leadership"]["role"] != "leader" {
                    last = format!("orchestrator {i}: {}", s["leadership"]);
                    continue;
                }
                let registered = s["agents"]
                    .as_array()
                    .and_then(|a| a.iter().find(|a| a["connected"] == true))
                    .and_then(|a| a["units"].as_array().map(|u| u.len()))
                    .unwrap_or(0);
                if registered == units {
                    return Ok((i, s["leadership"]["token"].as_u64().unwrap_or(0)));
                }
                last = format!("orchestrator {i} leads; the agent has not attached to it yet");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let agent_log = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
        let tail: Vec<&str> = agent_log.lines().rev().take(8).collect();
        bail!(
            "no orchestrator led with the agent attached within {limit:?}: {last}; the agent's last words: {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )
    }

    /// Any answering orchestrator's connection (history is served by all).
    pub async fn any_connection(&self) -> Option<Connection> {
        for o in self.orchestrators.iter().filter(|o| o.process.is_some() && !o.paused) {
            if o.connection.connect().await.is_ok() {
                return Some(o.connection.clone());
            }
        }
        None
    }

    /// The highest fencing token the agent has persisted.
    pub fn agent_fencing_floor(&self) -> Option<u64> {
        std::fs::read_to_string(self.agent_state_dir.join("fencing_token"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Stops everything; keeps the directory if `keep` and says where.
    pub fn stop(mut self, keep: bool) -> Option<PathBuf> {
        self.agent.stop(Duration::from_secs(15));
        for i in 0..self.orchestrators.len() {
            if self.orchestrators[i].paused {
                self.resume_orchestrator(i);
            }
        }
        for o in &mut self.orchestrators {
            if let Some(mut p) = o.process.take() {
                p.stop(Duration::from_secs(5));
            }
        }
        for i in 0..self.etcd.members.len() {
            self.etcd.kill(i);
        }
        keep.then(|| self.dir.keep())
    }
}

/// The leader-crash drill (`pdwarden demo --incident leader-crash`, and
/// the HA scenarios at every step): asks orchestrator `ask` (a follower
/// sends the CLI to the leader) for `restart pd-pair demo`, SIGKILLs the
/// leader once the operation's journaled state is `at`, and waits for a
/// follower to lead with the agent and conclude the operation. The
/// `--json` object: who was killed and who took over, the failover times,
/// what the agent spawned, the operation's record. The killed orchestrator
/// is started again afterwards (as its service manager would).
pub async fn leader_crash(ha: &mut HaStack, ask: usize, at: CrashAt, json: bool) -> anyhow::Result<Value> {
    let units = ha.units;
    let (leader, token) = ha.wait_leader_with_agent(units, Duration::from_secs(60)).await?;
    let agent_log = ha.dir.path().join("agent.log");
    let from = std::fs::metadata(&agent_log).map_or(0, |m| m.len());
    let asked = ha.orchestrators[ask].connection.clone();
    let follow = tokio::spawn(async move {
        asked
            .follow(PAIR, None, pdwarden_client::new_request_id(), |_| {})
            .await
    });
    let (op, decode_phase) = reached(&ha.orchestrators[leader].connection, at, Duration::from_secs(120)).await?;
    let killed_at = Instant::now();
    let pid = ha.kill_orchestrator(leader).context("the leader was not running")?;
    follow.abort();
    say(
        json,
        &format!(
            "SIGKILLed the leader, orchestrator {leader} (pid {pid}, fencing token {token}), during operation {op} in state {}, decode-0 {decode_phase}",
            at.state()
        ),
    );
    let (new, new_token) = ha.wait_leader_with_agent(units, Duration::from_secs(60)).await?;
    let serving = killed_at.elapsed();
    say(
        json,
        &format!(
            "orchestrator {new} leads (fencing token {new_token}) with the agent attached, {} ms after the kill",
            serving.as_millis()
        ),
    );
    // Moving again: the operation's journaled state changed, or it ended.
    let deadline = Instant::now() + Duration::from_secs(120);
    let moved = loop {
        match newest(ha).await {
            Some(r)
                if r["operation_id"] == op.as_str() && (r["state"] != at.state() || !r["ended_unix_ms"].is_null()) =>
            {
                break killed_at.elapsed();
            }
            _ if Instant::now() > deadline => bail!("operation {op} never moved after the kill"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let record = concluded(ha, &op, deadline.saturating_duration_since(Instant::now())).await?;
    let spawned = spawns_since(&agent_log, from);
    let twice = spawned_more_than_once(&spawned);
    say(
        json,
        &format!(
            "operation {op} concluded {} by orchestrator {new}; the operation moved again {} ms after the kill; spawned: {}",
            record["verdict"],
            moved.as_millis(),
            spawned
                .iter()
                .map(|(u, n)| format!("{u} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    ha.start_orchestrator(leader)?;
    Ok(serde_json::json!({
        "incident": "leader-crash",
        "operation_id": op,
        "state": at.state(),
        "verdict": record["verdict"],
        "killed": { "orchestrator": leader, "pid": pid, "fencing_token": token, "url": ha.orchestrators[leader].url },
        "new_leader": { "orchestrator": new, "fencing_token": new_token, "url": ha.orchestrators[new].url },
        "asked": { "orchestrator": ask, "url": ha.orchestrators[ask].url },
        "leader_serving_ms": serving.as_millis() as u64,
        "operation_moving_ms": moved.as_millis() as u64,
        "agent_fencing_floor": ha.agent_fencing_floor(),
        "spawned": spawned,
        "started_twice": twice,
        "record": record,
    }))
}

/// Waits (at most `limit`) until operation `op` is concluded in the shared
/// journal; its record.
pub async fn concluded(ha: &HaStack, op: &str, limit: Duration) -> anyhow::Result<Value> {
    let deadline = Instant::now() + limit;
    loop {
        match newest(ha).await {
            Some(r) if r["operation_id"] == op && !r["ended_unix_ms"].is_null() => return Ok(r),
            _ if Instant::now() > deadline => bail!("operation {op} not concluded within {limit:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The newest operation of the pair as any orchestrator's history says.
pub async fn newest(ha: &HaStack) -> Option<Value> {
    let c = ha.any_connection().await?;
    let mut client = c.connect().await.ok()?;
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        client.history(pdwarden_proto::v1::HistoryRequest {
            pair: PAIR.into(),
            limit: 1,
            ..Default::default()
        }),
    )
    .await
    .ok()?
    .ok()?;
    let v: Value = serde_json::from_str(&r.into_inner().json).ok()?;
    v.as_array()?.first().cloned()
}

/// Whether our child `pid` has ended (a zombie, not reaped here: its
/// owner reaps it).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

fn say(json: bool, line: &str) {
    if !json {
        pdwarden_client::say!("drill: {line}");
    }
}

fn toml_of(c: &pdwarden_agent::AgentConfig) -> anyhow::Result<String> {
    c.to_toml_string().context("the agent config as TOML")
}
