//! Config parsing: any bytes given as an orchestrator or agent config are
//! either accepted and valid, or rejected with an error; never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = pdwarden_orchestrator::config::OrchestratorConfig::from_toml_str(text);
        let _ = pdwarden_agent::AgentConfig::from_toml_str(text);
    }
});
