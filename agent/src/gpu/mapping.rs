//! Who owns a GPU process: a supervised unit, a unit that already died, or
//! nobody (foreign).
//!
//! Pure: it takes the host's process table and the units' pids and returns
//! owners, so every rule is a unit test. A process belongs to a unit when the
//! unit's process is the process itself or one of its ancestors (engines fork
//! workers: the pid on the GPU is rarely the one the agent spawned). Units
//! are spawned in their own process group, so a descendant that was
//! re-parented (its parent died, or it daemonised) is still found by its
//! process group id; a process group id cannot be reused while the group has
//! members, so this never attributes a stranger. A process whose group is a
//! unit's *previous* pid while the unit is not running is memory held by a
//! dead unit. Everything else is foreign.

use std::collections::HashMap;

/// One process, as far as ownership and footprint go.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcInfo {
    pub ppid: Option<u32>,
    /// Process group id, where known.
    pub pgid: Option<u32>,
    pub command_line: String,
    pub user: String,
    pub rss_bytes: u64,
    /// 100 = one full CPU.
    pub cpu_pct: f32,
}

/// The host's processes by pid.
pub type ProcTable = HashMap<u32, ProcInfo>;

/// A supervised unit's pids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitPids {
    pub name: String,
    /// The running process, if any.
    pub pid: Option<u32>,
    /// The pid of its latest run, kept after it exits.
    pub last_pid: Option<u32>,
}

/// Who owns a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A running unit's process or a descendant of it.
    Unit(String),
    /// Left behind by a unit that is no longer running.
    DeadUnit(String),
    Foreign,
}

/// Parent links are followed at most this far (guards against loops in a
/// table read while processes come and go).
const MAX_DEPTH: usize = 512;

/// The owner of `pid`.
pub fn owner_of(pid: u32, units: &[UnitPids], procs: &ProcTable) -> Owner {
    let running: HashMap<u32, &str> = units
        .iter()
        .filter_map(|u| u.pid.map(|p| (p, u.name.as_str())))
        .collect();
    let mut cur = Some(pid);
    for _ in 0..MAX_DEPTH {
        let Some(p) = cur else { break };
        if let Some(name) = running.get(&p) {
            return Owner::Unit((*name).to_owned());
        }
        if p <= 1 {
            break;
        }
        cur = procs.get(&p).and_then(|i| i.ppid);
    }
    let Some(pgid) = procs.get(&pid).and_then(|i| i.pgid) else {
        return Owner::Foreign;
    };
    if let Some(name) = running.get(&pgid) {
        return Owner::Unit((*name).to_owned());
    }
    units
        .iter()
        .find(|u| u.pid.is_none() && u.last_pid == Some(pgid))
        .map_or(Owner::Foreign, |u| Owner::DeadUnit(u.name.clone()))
}

/// A unit's footprint: its process and every process it owns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitUsage {
    pub rss_bytes: u64,
    pub cpu_pct: f32,
    pub processes: u32,
}

/// Every running unit's footprint, summed over the processes it owns.
pub fn unit_usage(units: &[UnitPids], procs: &ProcTable) -> HashMap<String, UnitUsage> {
    let mut out: HashMap<String, UnitUsage> = HashMap::new();
    for (&pid, info) in procs {
        if let Owner::Unit(name) = owner_of(pid, units, procs) {
            let u = out.entry(name).or_default();
            u.rss_bytes += info.rss_bytes;
            u.cpu_pct += info.cpu_pct;
            u.processes += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(ppid: u32, pgid: u32, cmd: &str) -> ProcInfo {
        ProcInfo {
            ppid: Some(ppid),
            pgid: Some(pgid),
            command_line: cmd.into(),
            user: "svc".into(),
            rss_bytes: 100,
            cpu_pct: 10.0,
        }
    }

    fn unit(name: &str, pid: Option<u32>, last: Option<u32>) -> UnitPids {
        UnitPids {
            name: name.into(),
            pid,
            last_pid: last.or(pid),
        }
    }

    /// init(1) ─ agent(10) ─ prefill(100) ─ sh(101) ─ python(102)
    ///         ─ decode(200)
    ///         ─ train.py(300)
    fn table() -> ProcTable {
        HashMap::from([
            (1, proc(0, 1, "init")),
            (10, proc(1, 10, "pdwarden-agent")),
            (100, proc(10, 100, "prefill")),
            (101, proc(100, 100, "sh")),
            (102, proc(101, 100, "python -m sglang")),
            (200, proc(10, 200, "decode")),
            (300, proc(1, 300, "python train.py")),
        ])
    }

    // Property: a process belongs to the unit whose process is itself or any ancestor.
    #[test]
    fn descendants_belong_to_their_unit() {
        let units = [unit("prefill-0", Some(100), None), unit("decode-0", Some(200), None)];
        let t = table();
        assert_eq!(owner_of(100, &units, &t), Owner::Unit("prefill-0".into()));
        assert_eq!(owner_of(102, &units, &t), Owner::Unit("prefill-0".into()));
        assert_eq!(owner_of(200, &units, &t), Owner::Unit("decode-0".into()));
    }

    // Property: a process no unit is an ancestor of is foreign, including one the agent cannot see.
    #[test]
    fn strangers_are_foreign() {
        let units = [unit("prefill-0", Some(100), None)];
        let t = table();
        assert_eq!(owner_of(300, &units, &t), Owner::Foreign);
        assert_eq!(owner_of(10, &units, &t), Owner::Foreign);
        assert_eq!(owner_of(9999, &units, &t), Owner::Foreign);
    }

    // Property: a re-parented descendant (its parent died) is still the unit's by its process group.
    #[test]
    fn reparented_descendant_found_by_process_group() {
        let units = [unit("prefill-0", Some(100), None)];
        let mut t = table();
        t.remove(&101);
        t.get_mut(&102).unwrap().ppid = Some(1);
        assert_eq!(owner_of(102, &units, &t), Owner::Unit("prefill-0".into()));
    }

    // Property: when a unit has died, a leftover of its process group is held by the dead unit.
    #[test]
    fn leftover_of_a_dead_unit() {
        let units = [unit("prefill-0", None, Some(100))];
        let mut t = table();
        t.remove(&100);
        t.remove(&101);
        t.get_mut(&102).unwrap().ppid = Some(1);
        assert_eq!(owner_of(102, &units, &t), Owner::DeadUnit("prefill-0".into()));
        // A running unit whose previous pid matches is not "dead".
        let restarted = [UnitPids {
            name: "prefill-0".into(),
            pid: Some(400),
            last_pid: Some(100),
        }];
        assert_eq!(owner_of(102, &restarted, &t), Owner::Foreign);
    }

    // Property: a parent loop in a racy table ends the walk instead of spinning.
    #[test]
    fn parent_loops_terminate() {
        let units = [unit("u", Some(100), None)];
        let t = HashMap::from([(5, proc(6, 5, "a")), (6, proc(5, 6, "b"))]);
        assert_eq!(owner_of(5, &units, &t), Owner::Foreign);
    }

    // Property: a unit's footprint sums its whole process tree and nothing else.
    #[test]
    fn usage_sums_the_tree() {
        let units = [unit("prefill-0", Some(100), None), unit("decode-0", Some(200), None)];
        let u = unit_usage(&units, &table());
        assert_eq!(u["prefill-0"].processes, 3);
        assert_eq!(u["prefill-0"].rss_bytes, 300);
        assert_eq!(u["decode-0"].processes, 1);
        assert!(!u.contains_key("train"));
    }
}
