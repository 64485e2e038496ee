//! A host's report and the findings as the human `status` prints them
//! (the CLI renders the orchestrator's typed view; nothing here decides).

use crate::host::HostReport;
use crate::judge::findings::HostFinding;

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB)
}

/// `[#######.............]`: the used share of `total` in `width` cells.
pub fn memory_bar(used: u64, total: u64, width: usize) -> String {
    let filled = if total == 0 {
        0
    } else {
        ((used as f64 / total as f64) * width as f64)
            .round()
            .clamp(0.0, width as f64) as usize
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// Where [`alert`]'s emphasis begins: bold red.
pub const ALERT_ON: &str = "\x1b[1;31m";
/// Where it ends: back to normal.
pub const ALERT_OFF: &str = "\x1b[0m";

/// ANSI emphasis for what must not be missed (foreign processes, critical
/// findings); plain text when `color` is off.
pub fn alert(text: &str, color: bool) -> String {
    if color {
        format!("{ALERT_ON}{text}{ALERT_OFF}")
    } else {
        text.to_owned()
    }
}

/// `text` as it may reach an operator's terminal (issue 48, item 4): much
/// of what pdwarden prints is an engine's, a router's or a log's own text,
/// and a control sequence in it acts on the terminal that shows it — OSC 52
/// writes the clipboard, OSC 0 retitles the window, `ESC [2J` clears the
/// screen, a carriage return overwrites the line, and a C1 control
/// (`U+009B` is CSI by itself) does the same without an ESC.
///
/// Every control character — C0 but newline and tab, DEL, C1 — is written
/// as `\u00XX`: readable, and in a JSON document's text the very escape
/// JSON uses, so JSON stays the same JSON (serde_json escapes C0 and leaves
/// DEL and C1 raw). The one exception is [`alert`]'s own emphasis,
/// [`ALERT_ON`] and [`ALERT_OFF`] exactly: they only colour, so an engine
/// that writes them turns text red, nothing more. Borrowed when nothing
/// needs escaping.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    let needs = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(needs) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if let Some(own) = [ALERT_ON, ALERT_OFF].into_iter().find(|s| rest.starts_with(s)) {
            out.push_str(own);
            rest = &rest[own.len()..];
            continue;
        }
        if needs(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

fn opt<T: std::fmt::Display>(v: Option<T>, suffix: &str) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v}{suffix}"))
}

fn ago(now_unix_ms: u64, then: u64) -> String {
    let s = now_unix_ms.saturating_sub(then) / 1000;
    if s < 120 {
        format!("{s} s ago")
    } else if s < 7200 {
        format!("{} min ago", s / 60)
    } else {
        format!("{} h ago", s / 3600)
    }
}

/// The lines `pdwarden status` prints under a host: GPUs with a memory bar,
/// utilisation, temperature and power, then each GPU process (foreign ones
/// marked and, with `color`, in red), then host and unit figures.
pub fn render_host_report(r: &HostReport, now_unix_ms: u64, color: bool) -> Vec<String> {
    let mut out = Vec::new();
    let age = if r.received_unix_ms > 0 {
        format!(", {}", ago(now_unix_ms, r.received_unix_ms))
    } else {
        String::new()
    };
    match &r.gpu_unavailable {
        Some(why) => out.push(format!("  gpus: none reported ({}: {why}){age}", r.gpu_source)),
        None => out.push(format!("  gpus ({}{age}):", r.gpu_source)),
    }
    for g in &r.gpus {
        let power = match (g.power_draw_w, g.power_limit_w) {
            (Some(d), Some(l)) => format!("  {d:.0}/{l:.0} W"),
            (Some(d), None) => format!("  {d:.0} W"),
            _ => String::new(),
        };
        out.push(format!(
            "    gpu{} {} {} {}/{} GiB  util {}  mem {}  {}{power}",
            g.index,
            if g.name.is_empty() { &g.uuid } else { &g.name },
            memory_bar(g.memory_used_bytes, g.memory_total_bytes, 20),
            gib(g.memory_used_bytes),
            gib(g.memory_total_bytes),
            opt(g.utilization_gpu_pct, "%"),
            opt(g.utilization_memory_pct, "%"),
            opt(g.temperature_c, "°C"),
        ));
        if !g.throttle_reasons.is_empty() {
            out.push(format!("      throttled: {}", g.throttle_reasons.join(", ")));
        }
        if let Some(e) = g.ecc
            && (e.volatile_uncorrected > 0 || e.aggregate_uncorrected > 0)
        {
            out.push(alert(
                &format!(
                    "      ECC uncorrected: {} since driver load, {} lifetime",
                    e.volatile_uncorrected, e.aggregate_uncorrected
                ),
                color,
            ));
        }
        if let Some(r) = g.remapped_rows
            && (r.pending || r.failure || r.uncorrectable > 0)
        {
            let state = match (r.failure, r.pending) {
                (true, _) => "; a remapping FAILED",
                (false, true) => "; a remapping is pending a GPU reset",
                _ => "",
            };
            out.push(alert(
                &format!(
                    "      rows remapped: {} after uncorrectable, {} after correctable errors{state}",
                    r.uncorrectable, r.correctable
                ),
                color,
            ));
        }
        for p in &g.processes {
            let mem = p.used_memory_bytes.map_or_else(|| "?".to_owned(), gib);
            let line = if p.foreign {
                alert(
                    &format!(
                        "      ! pid {:<7} FOREIGN   {mem:>6} GiB  {} ({})",
                        p.pid,
                        p.command_line,
                        if p.user.is_empty() { "?" } else { &p.user }
                    ),
                    color,
                )
            } else if p.unit_dead {
                alert(
                    &format!(
                        "      ! pid {:<7} {} (unit not running) {mem:>6} GiB  {}",
                        p.pid,
                        p.unit.as_deref().unwrap_or("?"),
                        p.command_line
                    ),
                    color,
                )
            } else {
                format!(
                    "        pid {:<7} {:<9} {mem:>6} GiB  {}",
                    p.pid,
                    p.unit.as_deref().unwrap_or("?"),
                    p.command_line
                )
            };
            out.push(line);
        }
    }
    if let Some(h) = &r.host {
        out.push(format!(
            "  host: cpu {:.0}% of {}  mem {}/{} GiB  load {:.2} {:.2} {:.2}",
            h.cpu_pct,
            h.cpu_count,
            gib(h.memory_used_bytes),
            gib(h.memory_total_bytes),
            h.load[0],
            h.load[1],
            h.load[2]
        ));
    }
    for u in r.units.iter().filter(|u| u.pid.is_some()) {
        out.push(format!(
            "    {:<14} rss {} GiB  cpu {:.0}%  {} processes",
            u.unit,
            gib(u.rss_bytes),
            u.cpu_pct,
            u.processes
        ));
    }
    out
}

/// The findings block of `pdwarden status` (nothing when there are none).
pub fn render_findings(findings: &[HostFinding], color: bool) -> Vec<String> {
    if findings.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!("findings ({}):", findings.len())];
    for f in findings {
        let line = match f.severity {
            crate::judge::findings::Severity::Critical => alert(&format!("  CRITICAL {}", f.message), color),
            crate::judge::findings::Severity::Warning => format!("  warning  {}", f.message),
        };
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 48, item 4: control characters are escaped as `\u00XX`
    /// (newline and tab kept; `alert`'s own colour kept), clean text is
    /// borrowed, and a multi-byte character next to a control is intact.
    #[test]
    fn terminal_safe_escapes_controls_only() {
        assert!(matches!(terminal_safe("é ok\n\tx"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(
            terminal_safe("\x1b]52;c;eA==\x07é\u{9b}2J\x1b[2J\r\x7f\0"),
            "\\u001b]52;c;eA==\\u0007é\\u009b2J\\u001b[2J\\u000d\\u007f\\u0000"
        );
        let red = alert("pid 9", true);
        assert_eq!(terminal_safe(&format!("{red}\x1b[8m")), format!("{red}\\u001b[8m"));
    }
}
