//! Issue 32 (secrets): the shipped systemd units keep what the services
//! write private. The journal, the agent's unit configs (gate values) and
//! its logs may hold credentials: `UMask=0077` makes every file the service
//! creates 0600, and `StateDirectoryMode=0700` keeps its state directory
//! (created by systemd) to the service user.

/// The unit's `Key=value` settings, comments and section headers left out.
fn settings(unit: &str) -> Vec<(String, String)> {
    let path = format!("{}/../deploy/systemd/{unit}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn shipped_units_keep_state_private() {
    for unit in ["pdwarden-orchestrator.service", "pdwarden-agent.service"] {
        let settings = settings(unit);
        let get = |k: &str| settings.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("UMask"), Some("0077"), "{unit}");
        assert_eq!(get("StateDirectoryMode"), Some("0700"), "{unit}");
        assert!(
            get("StateDirectory").is_some(),
            "{unit}: StateDirectoryMode needs a StateDirectory"
        );
    }
}
