//! Which engine of an xPyD pool is sick (issue 37), from the path matrix.
//!
//! In an xPyD pool behind one router every prefill is paired with every
//! decode, so one bad engine fails every path through it: a bad decode
//! fails its column, a bad prefill its row, and a decode that kept a
//! restarted prefill's old bootstrap identity (INCIDENTS row 1;
//! smg-project/smg#2382) fails only the cell of that prefill and that
//! decode. Probing every prefill → decode path once and reading the
//! matrix names the smallest set of engines that explains every failing
//! path; when nothing small explains it, it says so, and the caller falls
//! back to the whole ordered co-restart.
//!
//! Pure: the matrix in, the localisation out. The smallest explanation is
//! a minimum vertex cover of the failing cells (rows and columns), found
//! exhaustively: pools are small (at most [`MAX_ENGINES`] engines).

use serde::{Deserialize, Serialize};

/// Engines in a pool this judge localises over (prefills + decodes).
pub const MAX_ENGINES: usize = 16;

/// What one directed probe on one prefill → decode path found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathOutcome {
    Ok,
    /// Answered, over the pair's warm budget.
    Slow,
    Error,
    Timeout,
    /// Answered, and held to the reference: wrong (issue 34).
    WrongOutput,
}

impl PathOutcome {
    pub fn failed(self) -> bool {
        !matches!(self, PathOutcome::Ok | PathOutcome::Slow)
    }
}

/// Every prefill → decode path of a pool, probed: `cells[p][d]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matrix {
    pub prefills: Vec<String>,
    pub decodes: Vec<String>,
    pub cells: Vec<Vec<PathOutcome>>,
    /// How many probes each path was sent and how many failed, when it was
    /// probed more than once (a failing or ambiguous path is probed again
    /// before anything is named); empty: once each. A cell is the worst
    /// outcome its probes saw: one failure in three is a failing path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tries: Vec<Vec<Tries>>,
}

/// Probes sent along one path, and how many of them failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tries {
    pub sent: u32,
    pub failed: u32,
}

impl Matrix {
    /// What the probes of path `p → d` saw, in words.
    fn tries_of(&self, p: usize, d: usize) -> String {
        match self.tries.get(p).and_then(|r| r.get(d)) {
            Some(t) if t.sent > 1 => format!("{} of {} probes failed", t.failed, t.sent),
            _ => "one probe".into(),
        }
    }
}

/// One engine the matrix names, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    pub unit: String,
    /// "prefill" or "decode".
    pub role: String,
    pub why: String,
}

/// What the matrix says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Localisation {
    /// Every path answered.
    Healthy,
    /// These engines, and only these, explain every failing path.
    Engines { suspects: Vec<Suspect> },
    /// Nothing smaller than the whole pool explains the failures (every
    /// path fails, or no engine has a working path to compare with), or
    /// the matrix is malformed: restart the whole pair, in order.
    NotLocalised { why: String },
}

/// What `pdwarden diagnose NAME` answers (`--json`): the matrix, why each
/// failing path failed ("prefill → decode: …"), and the localisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub pair: String,
    pub matrix: Matrix,
    pub failures: Vec<String>,
    pub localisation: Localisation,
    pub took_ms: u64,
    /// The restart epochs the matrix was read with (agents' facts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<Epoch>,
    /// The evidence beside the matrix that it was read with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blames: Vec<Attribution>,
}

impl Diagnosis {
    /// One line for a report's reasons: what the matrix points to.
    pub fn summary(&self) -> String {
        let paths = self.matrix.prefills.len() * self.matrix.decodes.len();
        let failing = self.matrix.cells.iter().flatten().filter(|c| c.failed()).count();
        match &self.localisation {
            Localisation::Healthy => format!("path matrix: all {paths} prefill → decode paths answered"),
            Localisation::Engines { suspects } => format!(
                "path matrix: {failing} of {paths} paths fail; they point to {}",
                suspects
                    .iter()
                    .map(|s| format!("{} ({})", s.unit, s.role))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Localisation::NotLocalised { why } => {
                format!("path matrix: {failing} of {paths} paths fail; NOT LOCALISED: {why}")
            }
        }
    }

    /// The human `diagnose`: the matrix as a grid (rows: prefills), the
    /// failures, then what they point to.
    pub fn lines(&self) -> Vec<String> {
        let word = |o: PathOutcome| match o {
            PathOutcome::Ok => "ok",
            PathOutcome::Slow => "slow",
            PathOutcome::Error => "ERROR",
            PathOutcome::Timeout => "TIMEOUT",
            PathOutcome::WrongOutput => "WRONG",
        };
        let width = self.matrix.prefills.iter().map(String::len).max().unwrap_or(0).max(7);
        let mut out = vec![format!(
            "pair {}: {} prefill → decode paths probed in {} ms",
            self.pair,
            self.matrix.prefills.len() * self.matrix.decodes.len(),
            self.took_ms
        )];
        let mut head = format!("  {:width$}", "");
        for d in &self.matrix.decodes {
            head.push_str(&format!("  {d}"));
        }
        out.push(head);
        for (p, row) in self.matrix.prefills.iter().zip(&self.matrix.cells) {
            let mut line = format!("  {p:width$}");
            for (d, cell) in self.matrix.decodes.iter().zip(row) {
                line.push_str(&format!("  {:<w$}", word(*cell), w = d.len()));
            }
            out.push(line);
        }
        out.extend(self.failures.iter().map(|f| format!("  - {f}")));
        match &self.localisation {
            Localisation::Healthy => out.push("every path answered: nothing to localise".into()),
            Localisation::Engines { suspects } => {
                out.push(format!("the failures point to {} engine(s):", suspects.len()));
                out.extend(suspects.iter().map(|s| format!("  {} ({}): {}", s.unit, s.role, s.why)));
            }
            Localisation::NotLocalised { why } => out.push(format!(
                "NOT LOCALISED: {why}; the whole pair needs its ordered co-restart"
            )),
        }
        out
    }
}

impl Diagnosis {
    /// Folds in the greedy answers held to the reference along paths
    /// (issue 34's per-path check, `(prefill, decode, wrong)` by unit name,
    /// with or without its host): a path that answered but wrong is
    /// `wrong_output`, and the failures are localised again.
    pub fn with_output_checks(mut self, checks: &[(String, String, bool)]) -> Self {
        // Engines are "host/unit" end to end (issue 46, item 5): a unit of
        // the same name on another host is another engine.
        let mut changed = false;
        for (prefill, decode, _) in checks.iter().filter(|c| c.2) {
            let p = self.matrix.prefills.iter().position(|c| c == prefill);
            let d = self.matrix.decodes.iter().position(|c| c == decode);
            if let (Some(p), Some(d)) = (p, d)
                && !self.matrix.cells[p][d].failed()
            {
                self.matrix.cells[p][d] = PathOutcome::WrongOutput;
                self.failures.push(format!(
                    "{} → {}: wrong output: the greedy answer along it is not the reference's",
                    self.matrix.prefills[p], self.matrix.decodes[d]
                ));
                changed = true;
            }
        }
        if changed {
            self.localisation = localise(&self.matrix, &self.epochs, &self.blames);
        }
        self
    }
}

/// A prefill whose current process started after a decode last paired
/// with it: that decode may hold its old bootstrap identity (issue 37,
/// item 4; issue 46, item 3: read from the agents' facts, whoever
/// restarted it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    pub prefill: String,
    /// Decodes that paired with the prefill's previous process.
    pub decodes_before: Vec<String>,
}

/// Evidence against one engine of a failing path that is not the matrix:
/// the probe's connection to it was refused (the other side answered),
/// its own counters moved where its partner's did not. Only ever used to
/// tell apart the two engines of one failing path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribution {
    /// "host/unit".
    pub engine: String,
    pub why: String,
}

/// Localises the failing paths of `m` by proof (issue 46): a failing path
/// is evidence against both its engines, a working one evidence for both,
/// and an engine is named only when the evidence separates it.
///
/// With one engine at fault, every failing path goes through it. So:
/// - the failing paths share exactly one engine (two or more of them fail,
///   at least one path works): that engine, and no other, explains them;
/// - they share none: more than one engine fails: not localised;
/// - one failing path: the matrix cannot tell its prefill from its decode;
///   an [`Attribution`] naming exactly one of them, or an [`Epoch`] saying
///   the decode holds the prefill's old identity, separates them;
///   otherwise not localised (the caller probes again, then falls back to
///   the whole ordered co-restart);
/// - every path fails: nothing works to compare with: not localised.
///
/// Each suspect's `why` is built from the facts that named it, so it is
/// true of the matrix by construction (the property tests check it).
pub fn localise(m: &Matrix, epochs: &[Epoch], blames: &[Attribution]) -> Localisation {
    let (np, nd) = (m.prefills.len(), m.decodes.len());
    if np == 0 || nd == 0 || m.cells.len() != np || m.cells.iter().any(|r| r.len() != nd) {
        return Localisation::NotLocalised {
            why: format!("the matrix is not {np} prefills × {nd} decodes"),
        };
    }
    if np + nd > MAX_ENGINES {
        return Localisation::NotLocalised {
            why: format!("{} engines: over the {MAX_ENGINES} this localises over", np + nd),
        };
    }
    let failing: Vec<(usize, usize)> = (0..np)
        .flat_map(|p| (0..nd).map(move |d| (p, d)))
        .filter(|&(p, d)| m.cells[p][d].failed())
        .collect();
    if failing.is_empty() {
        return Localisation::Healthy;
    }
    if failing.len() == np * nd {
        return Localisation::NotLocalised {
            why: format!(
                "every one of the {} paths fails: no working path to compare with",
                np * nd
            ),
        };
    }
    let rows: Vec<usize> = dedup(failing.iter().map(|f| f.0));
    let cols: Vec<usize> = dedup(failing.iter().map(|f| f.1));
    let path = |p: usize, d: usize| format!("{} → {}", m.prefills[p], m.decodes[d]);
    let working = |cells: &mut dyn Iterator<Item = PathOutcome>| cells.filter(|c| !c.failed()).count();
    let tries = |p: usize, d: usize| m.tries_of(p, d);
    match (rows.as_slice(), cols.as_slice()) {
        // One failing path: its two engines are not told apart by the matrix.
        ([p], [d]) => {
            let (p, d) = (*p, *d);
            let stale = epochs
                .iter()
                .any(|e| e.prefill == m.prefills[p] && e.decodes_before.contains(&m.decodes[d]));
            let p_others = working(&mut (0..nd).filter(|&o| o != d).map(|o| m.cells[p][o]));
            let d_others = working(&mut (0..np).filter(|&o| o != p).map(|o| m.cells[o][d]));
            let against: Vec<&Attribution> = blames
                .iter()
                .filter(|b| b.engine == m.prefills[p] || b.engine == m.decodes[d])
                .collect();
            let blamed: Vec<&str> = dedup(against.iter().map(|b| b.engine.as_str()));
            let context = format!(
                "the one failing path ({}, {}); {}; {}",
                path(p, d),
                tries(p, d),
                others_line(&m.prefills[p], p_others, nd - 1),
                others_line(&m.decodes[d], d_others, np - 1)
            );
            if let [one] = blamed.as_slice() {
                let role = if *one == m.prefills[p] { "prefill" } else { "decode" };
                let whys: Vec<&str> = against.iter().map(|b| b.why.as_str()).collect();
                return Localisation::Engines {
                    suspects: vec![Suspect {
                        unit: one.to_string(),
                        role: role.into(),
                        why: format!("{}: {context}", whys.join("; ")),
                    }],
                };
            }
            if stale && blamed.is_empty() {
                return Localisation::Engines {
                    suspects: vec![Suspect {
                        unit: m.decodes[d].clone(),
                        role: "decode".into(),
                        why: format!(
                            "it paired with {} before that prefill's current process started: it holds the old bootstrap identity; {context}",
                            m.prefills[p]
                        ),
                    }],
                };
            }
            Localisation::NotLocalised {
                why: if blamed.len() > 1 {
                    format!("{context}; the other evidence names both engines")
                } else {
                    format!("{context}: nothing tells the prefill from the decode")
                },
            }
        }
        // Every failing path through one prefill.
        ([p], _) => {
            let p = *p;
            let failing_decodes: Vec<usize> = cols.clone();
            let stale: Vec<&str> = epochs
                .iter()
                .filter(|e| e.prefill == m.prefills[p])
                .flat_map(|e| e.decodes_before.iter().map(String::as_str))
                .collect();
            let works = working(&mut m.cells[p].iter().copied());
            if failing_decodes.iter().all(|&d| stale.contains(&m.decodes[d].as_str())) {
                // It fails with exactly the decodes that paired with its
                // previous process: they hold its old identity. When it
                // works with none (every decode is one of them), the same
                // failures would show were it still bad itself: said, and
                // the repair restarts them a few at a time, so the next
                // matrix tells which (a decode restarted after it that
                // still fails with it names it).
                let also = if works > 0 {
                    format!(", while {works} decode(s) that paired with its current process work with it")
                } else {
                    format!(
                        "; every decode of it did, so {} being still bad would fail the same paths: restarting one of them tells which",
                        m.prefills[p]
                    )
                };
                let suspects = failing_decodes
                    .iter()
                    .map(|&d| Suspect {
                        unit: m.decodes[d].clone(),
                        role: "decode".into(),
                        why: format!(
                            "it fails only with {} ({}), which it paired with before that prefill's current process started: it holds the old bootstrap identity{also}",
                            m.prefills[p],
                            tries(p, d)
                        ),
                    })
                    .collect();
                return Localisation::Engines { suspects };
            }
            Localisation::Engines {
                suspects: vec![Suspect {
                    unit: m.prefills[p].clone(),
                    role: "prefill".into(),
                    why: format!(
                        "{} of its {nd} paths fail ({}), and every failing path of the pool goes through it: no other one engine explains them",
                        failing_decodes.len(),
                        failing_decodes
                            .iter()
                            .map(|&d| path(p, d))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }],
            }
        }
        // Every failing path through one decode.
        (_, [d]) => {
            let d = *d;
            Localisation::Engines {
                suspects: vec![Suspect {
                    unit: m.decodes[d].clone(),
                    role: "decode".into(),
                    why: format!(
                        "{} of its {np} paths fail ({}), and every failing path of the pool goes through it: no other one engine explains them",
                        rows.len(),
                        rows.iter().map(|&p| path(p, d)).collect::<Vec<_>>().join(", ")
                    ),
                }],
            }
        }
        // The failing paths share no engine.
        _ => Localisation::NotLocalised {
            why: format!(
                "the {} failing paths ({} prefills, {} decodes) share no engine: more than one engine fails, and no one of them is singled out",
                failing.len(),
                rows.len(),
                cols.len()
            ),
        },
    }
}

/// "x: its other N paths work" in words.
fn others_line(engine: &str, working: usize, others: usize) -> String {
    match (others, working) {
        (0, _) => format!("{engine} has no other path"),
        (o, w) if o == w => format!("{engine}'s other {o} path(s) work"),
        (o, w) => format!("{w} of {engine}'s other {o} path(s) work"),
    }
}

fn dedup<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathOutcome::{Error as E, Ok as O, Timeout as T};

    fn matrix(np: usize, nd: usize, cells: Vec<Vec<PathOutcome>>) -> Matrix {
        Matrix {
            prefills: (0..np).map(|i| format!("prefill-{i}")).collect(),
            decodes: (0..nd).map(|i| format!("decode-{i}")).collect(),
            cells,
            tries: Vec::new(),
        }
    }

    fn units(l: &Localisation) -> Vec<String> {
        match l {
            Localisation::Engines { suspects } => suspects.iter().map(|s| s.unit.clone()).collect(),
            other => panic!("not localised: {other:?}"),
        }
    }

    fn not_localised(l: &Localisation) -> bool {
        matches!(l, Localisation::NotLocalised { .. })
    }

    #[test]
    fn a_wedged_decode_fails_its_column_in_2p2d_and_3p2d() {
        let m = matrix(2, 2, vec![vec![O, T], vec![O, T]]);
        assert_eq!(units(&localise(&m, &[], &[])), ["decode-1"]);
        let m = matrix(3, 2, vec![vec![T, O], vec![T, O], vec![T, O]]);
        assert_eq!(units(&localise(&m, &[], &[])), ["decode-0"]);
    }

    #[test]
    fn a_prefill_with_stale_transfer_state_fails_its_row() {
        let m = matrix(3, 2, vec![vec![O, O], vec![E, E], vec![O, O]]);
        let l = localise(&m, &[], &[]);
        assert_eq!(units(&l), ["prefill-1"]);
    }

    /// Issue 46, finding 1: in 1PnD a decode failing its only path is one
    /// failing cell; the old smallest-cover tie-break named the prefill
    /// ("every decode has a path that works without it": false for the
    /// failing decode). The matrix alone cannot tell them apart: not
    /// localised, unless evidence beside it names one side.
    #[test]
    fn in_1pnd_a_decodes_one_failing_path_never_names_the_prefill_by_a_tie() {
        let m = matrix(1, 3, vec![vec![O, E, O]]);
        let l = localise(&m, &[], &[]);
        assert!(not_localised(&l), "{l:?}");
        let Localisation::NotLocalised { why } = &l else {
            unreachable!()
        };
        assert!(why.contains("prefill-0 → decode-1"), "{why}");
        assert!(why.contains("decode-1 has no other path"), "{why}");
        assert!(why.contains("prefill-0's other 2 path(s) work"), "{why}");
        // The probe's connection to the decode was refused while the
        // prefill answered: the decode.
        let blame = [Attribution {
            engine: "decode-1".into(),
            why: "the probe's connection to it was refused while prefill-0 answered".into(),
        }];
        assert_eq!(units(&localise(&m, &[], &blame)), ["decode-1"]);
        // Evidence naming an engine off the failing path does not count.
        let elsewhere = [Attribution {
            engine: "decode-2".into(),
            why: "x".into(),
        }];
        assert!(not_localised(&localise(&m, &[], &elsewhere)));
        // Evidence naming both sides separates nothing.
        let both = [
            blame[0].clone(),
            Attribution {
                engine: "prefill-0".into(),
                why: "y".into(),
            },
        ];
        assert!(not_localised(&localise(&m, &[], &both)));
    }

    /// Issue 46, finding 2: an intermittent decode failing one of its two
    /// paths in 2P2D: the old cover named the prefill of that cell.
    #[test]
    fn an_intermittent_decodes_one_failing_cell_names_nobody() {
        let m = matrix(2, 2, vec![vec![O, O], vec![O, E]]);
        assert!(not_localised(&localise(&m, &[], &[])));
        // Probed again, its other path failed too: its column.
        let m = matrix(2, 2, vec![vec![O, E], vec![O, E]]);
        assert_eq!(units(&localise(&m, &[], &[])), ["decode-1"]);
    }

    #[test]
    fn a_decode_that_kept_a_restarted_prefills_identity_is_named_not_the_prefill() {
        let m = matrix(2, 2, vec![vec![E, O], vec![O, O]]);
        let epochs = [Epoch {
            prefill: "prefill-0".into(),
            decodes_before: vec!["decode-0".into(), "decode-1".into()],
        }];
        let l = localise(&m, &epochs, &[]);
        assert_eq!(units(&l), ["decode-0"]);
        let Localisation::Engines { suspects } = l else {
            unreachable!()
        };
        assert!(suspects[0].why.contains("old bootstrap identity"), "{:?}", suspects[0]);
        // Without the epoch, one failing path: nobody.
        assert!(not_localised(&localise(&m, &[], &[])));
        // 1P3D: the prefill restarted after decode-0 and decode-1 paired
        // with it, decode-2 paired with its new process: the two stale
        // decodes fail, the fresh one works: the stale ones.
        let m = matrix(1, 3, vec![vec![E, E, O]]);
        let epochs = [Epoch {
            prefill: "prefill-0".into(),
            decodes_before: vec!["decode-0".into(), "decode-1".into()],
        }];
        assert_eq!(units(&localise(&m, &epochs, &[])), ["decode-0", "decode-1"]);
    }

    /// Issue 46, finding 4: a restarted prefill failing with a decode that
    /// paired with its current process is itself bad: the prefill, never
    /// every decode. Failing with exactly the stale ones (all of them), the
    /// decodes are named and the why says the prefill would look the same.
    #[test]
    fn a_restarted_prefill_still_bad_is_named_not_every_decode() {
        let epochs = [Epoch {
            prefill: "prefill-0".into(),
            decodes_before: vec!["decode-0".into(), "decode-1".into()],
        }];
        let m = matrix(2, 2, vec![vec![E, E], vec![O, O]]);
        let l = localise(&m, &epochs, &[]);
        assert_eq!(units(&l), ["decode-0", "decode-1"]);
        let Localisation::Engines { suspects } = &l else {
            unreachable!()
        };
        assert!(
            suspects[0].why.contains("restarting one of them tells which"),
            "{suspects:?}"
        );
        // A fresh decode failing with it too: the prefill.
        let m = matrix(2, 3, vec![vec![E, E, E], vec![O, O, O]]);
        assert_eq!(units(&localise(&m, &epochs, &[])), ["prefill-0"]);
    }

    #[test]
    fn two_engines_failing_at_once_are_not_localised() {
        // 3P3D: decode-0 and prefill-2 bad: the failing paths share no one
        // engine.
        let m = matrix(3, 3, vec![vec![E, O, O], vec![E, O, O], vec![E, E, E]]);
        let l = localise(&m, &[], &[]);
        assert!(
            matches!(&l, Localisation::NotLocalised { why } if why.contains("share no engine")),
            "{l:?}"
        );
        let m = matrix(2, 2, vec![vec![E, O], vec![O, E]]);
        assert!(not_localised(&localise(&m, &[], &[])));
    }

    #[test]
    fn everything_failing_or_nothing_is_said_as_such() {
        let m = matrix(2, 2, vec![vec![E, T], vec![T, E]]);
        let l = localise(&m, &[], &[]);
        assert!(
            matches!(&l, Localisation::NotLocalised { why } if why.contains("every one of the 4")),
            "{l:?}"
        );
        let m = matrix(2, 2, vec![vec![O, PathOutcome::Slow], vec![O, O]]);
        assert_eq!(localise(&m, &[], &[]), Localisation::Healthy);
        let bad = matrix(2, 2, vec![vec![O]]);
        assert!(not_localised(&localise(&bad, &[], &[])));
    }

    #[test]
    fn wrong_output_on_a_path_counts_as_failing() {
        let m = matrix(
            2,
            2,
            vec![vec![O, PathOutcome::WrongOutput], vec![O, PathOutcome::WrongOutput]],
        );
        assert_eq!(units(&localise(&m, &[], &[])), ["decode-1"]);
    }

    fn diagnosis(m: Matrix) -> Diagnosis {
        Diagnosis {
            pair: "p".into(),
            localisation: localise(&m, &[], &[]),
            matrix: m,
            failures: Vec::new(),
            took_ms: 1,
            epochs: Vec::new(),
            blames: Vec::new(),
        }
    }

    /// A path that answered but answered wrong (issue 34's per-path
    /// check) counts: a decode whose every path answers wrong is named.
    #[test]
    fn wrong_output_along_paths_is_folded_in_and_localised() {
        let d = diagnosis(matrix(2, 2, vec![vec![O, O], vec![O, O]]));
        assert_eq!(d.localisation, Localisation::Healthy);
        let checks = [
            ("prefill-0".to_string(), "decode-1".to_string(), true),
            ("prefill-1".to_string(), "decode-1".to_string(), true),
            ("prefill-0".to_string(), "decode-0".to_string(), false),
        ];
        let d = d.with_output_checks(&checks);
        assert_eq!(units(&d.localisation), ["decode-1"]);
        assert_eq!(d.matrix.cells[0][1], PathOutcome::WrongOutput);
        assert_eq!(d.failures.len(), 2);
        assert!(d.lines().join("\n").contains("WRONG"));
    }

    /// Issue 46, finding 5: units of the same name on two hosts are two
    /// engines; a finding by unit name alone used to land on either.
    #[test]
    fn a_finding_lands_on_its_own_hosts_engine_only() {
        let m = Matrix {
            prefills: vec!["a/prefill".into(), "b/prefill".into()],
            decodes: vec!["a/decode".into(), "b/decode".into()],
            cells: vec![vec![O, O], vec![O, O]],
            tries: Vec::new(),
        };
        let checks = [
            ("a/prefill".to_string(), "b/decode".to_string(), true),
            ("b/prefill".to_string(), "b/decode".to_string(), true),
            // A bare unit name is no engine of this pool.
            ("prefill".to_string(), "decode".to_string(), true),
        ];
        let d = diagnosis(m).with_output_checks(&checks);
        assert_eq!(
            d.matrix.cells,
            vec![vec![O, PathOutcome::WrongOutput], vec![O, PathOutcome::WrongOutput]]
        );
        assert_eq!(units(&d.localisation), ["b/decode"]);
    }

    #[test]
    fn the_diagnosis_prints_the_grid_and_what_it_points_to() {
        let mut d = diagnosis(matrix(2, 2, vec![vec![O, T], vec![O, T]]));
        d.failures = vec!["prefill-0 → decode-1: timed out".into()];
        d.took_ms = 12;
        let text = d.lines().join("\n");
        assert!(text.contains("prefill-0  ok        TIMEOUT"), "{text}");
        assert!(
            text.contains("the failures point to 1 engine(s):\n  decode-1 (decode)"),
            "{text}"
        );
        assert!(text.contains("- prefill-0 → decode-1: timed out"), "{text}");
    }

    /// Issue 46, done-when 1: random pools, random single-engine faults.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A fault: which engine (prefills first), deterministic or
        /// which of its paths failed in the probes (intermittent).
        #[derive(Debug, Clone)]
        struct Case {
            np: usize,
            nd: usize,
            faulty: usize,
            /// Per path of the faulty engine: failed in some probe.
            fails: Vec<bool>,
            outcome: PathOutcome,
            /// Evidence beside the matrix naming the faulty engine.
            blamed: bool,
        }

        fn case() -> impl Strategy<Value = Case> {
            (1usize..=4, 1usize..=4)
                .prop_filter("a pool", |(np, nd)| np + nd > 2)
                .prop_flat_map(|(np, nd)| {
                    let n = np + nd;
                    (0..n).prop_flat_map(move |faulty| {
                        let paths = if faulty < np { nd } else { np };
                        (
                            prop::collection::vec(any::<bool>(), paths),
                            any::<bool>(),
                            prop_oneof![
                                Just(PathOutcome::Error),
                                Just(PathOutcome::Timeout),
                                Just(PathOutcome::WrongOutput)
                            ],
                            any::<bool>(),
                        )
                            .prop_map(move |(some, deterministic, outcome, blamed)| Case {
                                np,
                                nd,
                                faulty,
                                fails: if deterministic { vec![true; some.len()] } else { some },
                                outcome,
                                blamed,
                            })
                    })
                })
        }

        fn build(c: &Case) -> (Matrix, String, Vec<Attribution>) {
            let mut m = matrix(c.np, c.nd, vec![vec![O; c.nd]; c.np]);
            for (i, fail) in c.fails.iter().enumerate() {
                if *fail {
                    let (p, d) = if c.faulty < c.np {
                        (c.faulty, i)
                    } else {
                        (i, c.faulty - c.np)
                    };
                    m.cells[p][d] = c.outcome;
                }
            }
            let name = if c.faulty < c.np {
                m.prefills[c.faulty].clone()
            } else {
                m.decodes[c.faulty - c.np].clone()
            };
            let blames = if c.blamed {
                vec![Attribution {
                    engine: name.clone(),
                    why: "its own evidence".into(),
                }]
            } else {
                Vec::new()
            };
            (m, name, blames)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

            /// Never an engine that is not faulty; the faulty one whenever
            /// its probes separate it (two or more of its paths fail and one
            /// path of the pool works, or one fails and evidence beside the
            /// matrix names it); otherwise "not localised".
            #[test]
            fn names_only_the_faulty_engine_and_it_whenever_separated(c in case()) {
                let (m, faulty, blames) = build(&c);
                let failing = c.fails.iter().filter(|f| **f).count();
                let l = localise(&m, &[], &blames);
                let separated = failing > 0
                    && failing < c.np * c.nd
                    && (failing >= 2 || c.blamed);
                match &l {
                    Localisation::Healthy => prop_assert_eq!(failing, 0),
                    Localisation::Engines { suspects } => {
                        prop_assert_eq!(suspects.len(), 1, "{:?}", l);
                        prop_assert_eq!(&suspects[0].unit, &faulty);
                        prop_assert!(separated, "named without separation: {:?} {:?}", c, l);
                    }
                    Localisation::NotLocalised { .. } => prop_assert!(!separated, "separated but not named: {:?} {:?}", c, l),
                }
            }

            /// Any matrix at all: whatever is named explains every failing
            /// path (each goes through it), and its `why` counts its failing
            /// paths as the matrix has them.
            #[test]
            fn every_why_is_true_of_any_matrix(
                np in 1usize..=4,
                nd in 1usize..=4,
                bits in prop::collection::vec(0u8..4, 16),
            ) {
                let cells: Vec<Vec<PathOutcome>> = (0..np)
                    .map(|p| (0..nd).map(|d| match bits[p * nd + d] { 0 => E, 1 => T, _ => O }).collect())
                    .collect();
                let m = matrix(np, nd, cells);
                if let Localisation::Engines { suspects } = localise(&m, &[], &[]) {
                    prop_assert_eq!(suspects.len(), 1);
                    let s = &suspects[0];
                    for p in 0..np {
                        for d in 0..nd {
                            if m.cells[p][d].failed() {
                                prop_assert!(m.prefills[p] == s.unit || m.decodes[d] == s.unit, "{:?} {:?}", m, s);
                            }
                        }
                    }
                    let (mine, of): (usize, usize) = if s.role == "prefill" {
                        let p = m.prefills.iter().position(|u| *u == s.unit).unwrap();
                        (m.cells[p].iter().filter(|c| c.failed()).count(), nd)
                    } else {
                        let d = m.decodes.iter().position(|u| *u == s.unit).unwrap();
                        (m.cells.iter().filter(|r| r[d].failed()).count(), np)
                    };
                    let said = format!("{mine} of its {of} paths fail");
                    prop_assert!(s.why.starts_with(&said), "{} vs {}", s.why, said);
                }
            }
        }
    }
}
