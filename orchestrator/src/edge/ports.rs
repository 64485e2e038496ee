//! Loopback ports for local stacks (`pdwarden demo`, the benchmarks), whose
//! engines bind their ports seconds after the port is chosen.
//!
//! Binding port 0 and releasing it hands out a port from the kernel's
//! ephemeral range, which any outgoing connection on the machine may take as
//! its source port before the engine binds it. This module picks from below
//! that range instead.

use std::net::TcpListener;

/// A free loopback port for a process that binds it seconds later (pd-sim
/// listens only after its simulated load). Taken from below the kernel's
/// ephemeral range: a port inside it can meanwhile become some outgoing
/// connection's source port (a CI run lost a prefill that way: "address in
/// use" 3 s in), one outside it cannot. Never the same port twice per process.
// The clock only seeds where in the range to start looking (not a timing).
#[allow(clippy::disallowed_methods)]
pub fn late_bind_port() -> std::io::Result<u16> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    const FROM: u16 = 10_000;
    if ephemeral_low > FROM + 1_000 {
        let span = u64::from(ephemeral_low - FROM);
        // Spread concurrent demos over the range.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
        let start = (u64::from(std::process::id()) * 7_919 + nanos) % span;
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..span.min(4_000) {
            let port = FROM + ((start + i * 13) % span) as u16;
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
        let ports: Vec<u16> = (0..20).map(|_| late_bind_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for p in &ports {
            if let Some(low) = low.filter(|l| *l > 11_000) {
                assert!((10_000..low).contains(p), "{p} not below {low}");
            }
            // Still free: the probe's listener was released.
            drop(TcpListener::bind(("127.0.0.1", *p)).unwrap());
        }
    }
}
