//! Issue 18: the deploy files are checked, not just written. The systemd
//! units pass `systemd-analyze verify` against the binaries this build
//! made (their `ExecStart` pointed at them), and say what the daemons do:
//! `Type=notify` with a watchdog, only the daemon notifying, and the
//! agent's `KillMode=process` (a restarted agent must not take its engines
//! with it).

use std::process::Command;

use crate::harness::bin;

/// `systemd-analyze verify` on `unit` with `/usr/bin/` pointed at
/// this build's binaries: what it said (empty when the unit is clean).
fn verify(unit: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(format!("{}/../deploy/systemd/{unit}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let bin_dir = bin("pdwarden-agent").parent().unwrap().display().to_string();
    let local = dir.path().join(unit);
    std::fs::write(&local, text.replace("/usr/bin/", &format!("{bin_dir}/"))).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .output()
        .expect("systemd-analyze not found: run scripts/setup-checks.sh (Debian's systemd package)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        said.trim().to_string()
    } else {
        format!("exit {:?}: {said}", out.status.code())
    }
}

fn setting<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn systemd_units_verify_and_say_notify_watchdog_and_kill_mode() {
    for unit in ["pdwarden-agent.service", "pdwarden-orchestrator.service"] {
        assert_eq!(verify(unit), "", "{unit}");
        let text = std::fs::read_to_string(format!("{}/../deploy/systemd/{unit}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(setting(&text, "Type"), ["notify"], "{unit}");
        assert_eq!(setting(&text, "NotifyAccess"), ["main"], "{unit}");
        assert_eq!(setting(&text, "WatchdogSec").len(), 1, "{unit}");
    }
    let agent = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/systemd/pdwarden-agent.service"
    ))
    .unwrap();
    assert_eq!(setting(&agent, "KillMode"), ["process"]);
    // The check can fail: a misspelt setting is reported.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.service");
    std::fs::write(&bad, "[Service]\nType=notifyy\nExecStart=/bin/true\n").unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("notifyy"));
}

/// The Kubernetes manifests, each document validated against the
/// Kubernetes schemas (`kubernetes-validate --strict`: an unknown field is
/// an error), as `scripts/check-k8s.py` prints them.
fn manifests() -> Vec<serde_json::Value> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let files: Vec<String> = std::fs::read_dir(format!("{root}/deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    let out = Command::new(format!("{root}/.venv-checks/bin/python"))
        .arg(format!("{root}/scripts/check-k8s.py"))
        .args(&files)
        .output()
        .expect("no .venv-checks: run scripts/setup-checks.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["doc"].clone())
        .collect()
}

fn kind<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in deploy/kubernetes"))
}

fn example(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The manifests validate and say what pdwarden needs: one orchestrator
/// (the journal has one owner) on its own volume; an agent on every GPU node
/// with the host's PIDs and network, the GPU taint tolerated, never rolled
/// over by itself (its engines die with its pod); their configs are the
/// example files, which load as the daemons load them.
#[test]
fn kubernetes_manifests_validate_and_carry_the_example_configs() {
    let docs = manifests();
    let deploy = kind(&docs, "Deployment", "pdwarden-orchestrator");
    assert_eq!(deploy["spec"]["replicas"], 1);
    assert_eq!(deploy["spec"]["strategy"]["type"], "Recreate");
    let pod = &deploy["spec"]["template"]["spec"];
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let journal_mount = mounts
        .iter()
        .find(|m| m["name"] == "journal")
        .expect("the journal volume mounted");
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "journal" && v["persistentVolumeClaim"]["claimName"] == "pdwarden-journal")
    );
    kind(&docs, "PersistentVolumeClaim", "pdwarden-journal");
    let orch_toml = kind(&docs, "ConfigMap", "pdwarden-orchestrator")["data"]["orchestrator.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        orch_toml,
        example("orchestrator.toml"),
        "the ConfigMap is deploy/examples/orchestrator.toml"
    );
    let orch = pdwarden_orchestrator::config::OrchestratorConfig::from_toml_str(&orch_toml).unwrap();
    assert!(
        orch.journal
            .sqlite_path()
            .expect("a SQLite journal")
            .starts_with(journal_mount["mountPath"].as_str().unwrap()),
        "the journal {} is on the volume",
        orch.journal
    );

    let ds = kind(&docs, "DaemonSet", "pdwarden-agent");
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["hostNetwork"], true);
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "nvidia.com/gpu" && t["operator"] == "Exists")
    );
    let agent_toml = kind(&docs, "ConfigMap", "pdwarden-agent")["data"]["agent.toml"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        agent_toml,
        example("agent-vllm-pd.toml"),
        "the ConfigMap is deploy/examples/agent-vllm-pd.toml"
    );
    for sa in ["pdwarden-orchestrator", "pdwarden-agent"] {
        assert_eq!(kind(&docs, "ServiceAccount", sa)["automountServiceAccountToken"], false);
    }
    kind(&docs, "Role", "pdwarden-operator");

    // Every pair unit the orchestrator names is a unit of the agent's host.
    let agent =
        pdwarden_agent::AgentConfig::from_toml_str(&agent_toml.replace("__NODE_NAME__", "gpu-node-01")).unwrap();
    for pair in &orch.pairs {
        for u in pair.prefill.iter().chain(&pair.decode).chain(&pair.router) {
            assert_eq!(u.host, agent.host, "{pair:?}");
            assert!(
                agent.units.iter().any(|a| a.name == u.unit),
                "{} not in the agent config",
                u.unit
            );
        }
    }
    pdwarden_agent::AgentConfig::from_toml_str(&example("agent-sglang-pd.toml")).expect("the SGLang example loads");

    // The check can fail: an unknown field is refused.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}, ports: [{port: 1}]}\n",
    )
    .unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new(format!("{root}/.venv-checks/bin/python"))
        .arg(format!("{root}/scripts/check-k8s.py"))
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("selectr"));
}

/// Issue 19: the three-orchestrator configs in deploy/ha/ load as the
/// daemons load them; they share the journal (etcd), the pairs and the
/// operators and differ only in what each advertises; the agent is given
/// all three, which are the advertised URLs; the orchestrators' pair names
/// the agent's units.
#[test]
fn ha_configs_load() {
    use pdwarden_orchestrator::config::{JournalSpec, OrchestratorConfig};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ha");
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
    let orchs: Vec<OrchestratorConfig> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            OrchestratorConfig::from_toml_str(&read(&format!("orchestrator-{n}.toml")))
                .unwrap_or_else(|e| panic!("orchestrator-{n}.toml: {e}"))
        })
        .collect();
    let JournalSpec::Etcd(endpoints) = &orchs[0].journal else {
        panic!("an etcd journal: {}", orchs[0].journal)
    };
    assert_eq!(endpoints.len(), 3, "a three-member etcd cluster");
    let advertised: Vec<String> = orchs
        .iter()
        .map(|o| o.leadership.as_ref().expect("[leadership]").advertise_url.clone())
        .collect();
    for o in &orchs[1..] {
        assert_eq!(o.journal, orchs[0].journal, "one journal");
        assert_eq!(
            serde_json::to_value(&o.pairs).unwrap(),
            serde_json::to_value(&orchs[0].pairs).unwrap(),
            "the same pairs"
        );
        assert_eq!(o.operators.len(), orchs[0].operators.len());
    }
    let agent = pdwarden_agent::AgentConfig::from_toml_str(&read("agent.toml")).expect("the HA agent config loads");
    assert_eq!(
        agent.orchestrator.urls(),
        advertised.as_slice(),
        "the agent dials the three"
    );
    for u in orchs[0]
        .pairs
        .iter()
        .flat_map(|p| p.prefill.iter().chain(&p.decode).chain(&p.router))
    {
        assert_eq!(u.host, agent.host);
        assert!(
            agent.units.iter().any(|a| a.name == u.unit),
            "{} not in the agent config",
            u.unit
        );
    }
}
