//! The soak's short form (issue 16): 150 s of co-restarts, verifications
//! and gates on the local stack with the orchestrator and the agent
//! SIGKILLed at random mid-operation (seed 7: several of each), every
//! invariant checked after each operation (`pdwarden_stack::soak`). The
//! long form is `pdwarden soak --seconds 3600` (docs/operating.md, Faults).

use crate::harness::exclusive;

#[test]
fn a_short_soak_with_random_kills_keeps_every_invariant() {
    let _one = exclusive();
    let args = pdwarden_stack::soak::SoakArgs {
        seconds: 150,
        seed: 7,
        json: false,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(pdwarden_stack::soak::run(&args)).expect("the soak runs");
    println!("{}", report.render());
    assert!(report.violations.is_empty(), "{}", report.render());
    let faults: u64 = report.faults.values().sum();
    let ops: u64 = report.operations.values().sum();
    assert!(
        faults >= 3 && ops >= 8 && report.faults.len() == 2,
        "too little was exercised: {}",
        report.render()
    );
    // Issue 36: the daemons' log volume is reported, and bounded even with
    // a fault every few seconds (logs on change only: issue 31).
    assert_eq!(report.log_volume.len(), 2, "{}", report.render());
    for v in &report.log_volume {
        assert!(v.lines > 0, "{v:?}");
        assert!(
            v.bytes_per_pair_hour < 64.0 * 1024.0 * 1024.0,
            "{} logs {:.1} MiB per pair per hour",
            v.process,
            v.bytes_per_pair_hour / 1048576.0
        );
    }
}
