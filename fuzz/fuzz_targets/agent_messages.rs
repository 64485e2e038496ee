//! The gRPC messages the orchestrator accepts from agents: arbitrary bytes
//! decoded as `AgentMessage` and handled by the fleet registry (and its
//! status view). Never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = pdwarden_proto::v1::AgentMessage::decode(data) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let fleet = pdwarden_orchestrator::edge::fleet::Fleet::new();
            fleet.ingest_for_fuzzing("fuzz-host", msg);
        });
    }
});
