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
    pub fn with_output_checks(mut self, checks: &[(String, String, bool)], epochs: &[Epoch]) -> Self {
        let is = |cell: &str, unit: &str| cell == unit || cell.rsplit('/').next() == Some(unit);
        let mut changed = false;
        for (prefill, decode, _) in checks.iter().filter(|c| c.2) {
            let p = self.matrix.prefills.iter().position(|c| is(c, prefill));
            let d = self.matrix.decodes.iter().position(|c| is(c, decode));
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
            self.localisation = localise(&self.matrix, epochs);
        }
        self
    }
}

/// A prefill that restarted after a decode last paired with it: that
/// decode may hold its old bootstrap identity (issue 37, item 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    pub prefill: String,
    /// Decodes that paired with the prefill's previous process.
    pub decodes_before: Vec<String>,
}

/// Localises the failing paths of `m`. `epochs`: prefills restarted since
/// the decodes last paired with them, to tell a stale identity (the decode
/// holds it) from a bad path.
pub fn localise(m: &Matrix, epochs: &[Epoch]) -> Localisation {
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
    // The smallest set of rows and columns covering every failing cell.
    let n = np + nd;
    let covers = |set: u32| {
        failing
            .iter()
            .all(|&(p, d)| set & (1 << p) != 0 || set & (1 << (np + d)) != 0)
    };
    let best = (1u32..(1 << n))
        .filter(|&set| covers(set))
        .min_by_key(|set| (set.count_ones(), *set))
        .expect("all rows cover every cell");
    let size = best.count_ones() as usize;
    // A cover as large as a whole side says nothing about engines.
    if size >= np.min(nd) && size > 1 {
        return Localisation::NotLocalised {
            why: format!(
                "{} failing paths need {size} engines to explain, as many as a whole side: no engine is singled out",
                failing.len()
            ),
        };
    }
    let mut suspects = Vec::new();
    for p in (0..np).filter(|p| best & (1 << p) != 0) {
        let fails = (0..nd).filter(|&d| m.cells[p][d].failed()).count();
        let stale: Vec<&str> = epochs
            .iter()
            .filter(|e| e.prefill == m.prefills[p])
            .flat_map(|e| e.decodes_before.iter().map(String::as_str))
            .collect();
        let failing_decodes: Vec<&str> = (0..nd)
            .filter(|&d| m.cells[p][d].failed())
            .map(|d| m.decodes[d].as_str())
            .collect();
        if !failing_decodes.is_empty() && failing_decodes.iter().all(|d| stale.contains(d)) {
            // Only decodes that held its old identity fail with it (all of
            // them, when every decode had met it): they are what is stale,
            // not the prefill just restarted and proven. If the prefill is
            // bad after all, their restart does not help, and the caller's
            // next round says so.
            for d in failing_decodes {
                suspects.push(Suspect {
                    unit: d.to_string(),
                    role: "decode".into(),
                    why: format!(
                        "fails only with {}, which restarted after it paired with it: it holds the old bootstrap identity",
                        m.prefills[p]
                    ),
                });
            }
            continue;
        }
        suspects.push(Suspect {
            unit: m.prefills[p].clone(),
            role: "prefill".into(),
            why: format!("{fails} of its {nd} paths fail, and every decode has a path that works without it"),
        });
    }
    for d in (0..nd).filter(|d| best & (1 << (np + d)) != 0) {
        let fails = (0..np).filter(|&p| m.cells[p][d].failed()).count();
        suspects.push(Suspect {
            unit: m.decodes[d].clone(),
            role: "decode".into(),
            why: format!("{fails} of its {np} paths fail, and every prefill has a path that works without it"),
        });
    }
    Localisation::Engines { suspects }
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
        }
    }

    fn units(l: &Localisation) -> Vec<String> {
        match l {
            Localisation::Engines { suspects } => suspects.iter().map(|s| s.unit.clone()).collect(),
            other => panic!("not localised: {other:?}"),
        }
    }

    #[test]
    fn a_wedged_decode_fails_its_column_in_2p2d_and_3p2d() {
        let m = matrix(2, 2, vec![vec![O, T], vec![O, T]]);
        assert_eq!(units(&localise(&m, &[])), ["decode-1"]);
        let m = matrix(3, 2, vec![vec![T, O], vec![T, O], vec![T, O]]);
        assert_eq!(units(&localise(&m, &[])), ["decode-0"]);
    }

    #[test]
    fn a_prefill_with_stale_transfer_state_fails_its_row() {
        let m = matrix(3, 2, vec![vec![O, O], vec![E, E], vec![O, O]]);
        let l = localise(&m, &[]);
        assert_eq!(units(&l), ["prefill-1"]);
    }

    #[test]
    fn a_decode_that_kept_a_restarted_prefills_identity_is_named_not_the_prefill() {
        let m = matrix(2, 2, vec![vec![E, O], vec![O, O]]);
        let epochs = [Epoch {
            prefill: "prefill-0".into(),
            decodes_before: vec!["decode-0".into(), "decode-1".into()],
        }];
        let l = localise(&m, &epochs);
        assert_eq!(units(&l), ["decode-0"]);
        let Localisation::Engines { suspects } = l else {
            unreachable!()
        };
        assert!(suspects[0].why.contains("old bootstrap identity"), "{:?}", suspects[0]);
        // Every decode met the restarted prefill and all fail with it: the
        // decodes, not the prefill again.
        let m2 = matrix(2, 2, vec![vec![E, E], vec![O, O]]);
        assert_eq!(units(&localise(&m2, &epochs)), ["decode-0", "decode-1"]);
        // Without the epoch, the one failing path is the prefill's or the
        // decode's: the smallest cover names one of them (the prefill row
        // sorts first), never both.
        assert_eq!(units(&localise(&m, &[])).len(), 1);
    }

    #[test]
    fn two_engines_failing_at_once_are_both_named_or_not_localised() {
        // 3P3D: decode-0 and prefill-2 bad: a cover of two.
        let m = matrix(3, 3, vec![vec![E, O, O], vec![E, O, O], vec![E, E, E]]);
        let mut u = units(&localise(&m, &[]));
        u.sort();
        assert_eq!(u, ["decode-0", "prefill-2"]);
        // 2P2D with two bad engines: the cover is a whole side: no single
        // engine is singled out.
        let m = matrix(2, 2, vec![vec![E, O], vec![E, E]]);
        assert!(
            matches!(localise(&m, &[]), Localisation::NotLocalised { .. }),
            "{:?}",
            localise(&m, &[])
        );
    }

    #[test]
    fn everything_failing_or_nothing_is_said_as_such() {
        let m = matrix(2, 2, vec![vec![E, T], vec![T, E]]);
        let l = localise(&m, &[]);
        assert!(
            matches!(&l, Localisation::NotLocalised { why } if why.contains("every one of the 4")),
            "{l:?}"
        );
        let m = matrix(2, 2, vec![vec![O, PathOutcome::Slow], vec![O, O]]);
        assert_eq!(localise(&m, &[]), Localisation::Healthy);
        let bad = matrix(2, 2, vec![vec![O]]);
        assert!(matches!(localise(&bad, &[]), Localisation::NotLocalised { .. }));
    }

    #[test]
    fn wrong_output_on_a_path_counts_as_failing() {
        let m = matrix(
            2,
            2,
            vec![vec![O, PathOutcome::WrongOutput], vec![O, PathOutcome::WrongOutput]],
        );
        assert_eq!(units(&localise(&m, &[])), ["decode-1"]);
    }

    /// A path that answered but answered wrong (issue 34's per-path
    /// check) counts: a decode whose every path answers wrong is named.
    #[test]
    fn wrong_output_along_paths_is_folded_in_and_localised() {
        let m = matrix(2, 2, vec![vec![O, O], vec![O, O]]);
        let d = Diagnosis {
            pair: "p".into(),
            localisation: localise(&m, &[]),
            matrix: m,
            failures: Vec::new(),
            took_ms: 1,
        };
        assert_eq!(d.localisation, Localisation::Healthy);
        let checks = [
            ("prefill-0".to_string(), "decode-1".to_string(), true),
            ("prefill-1".to_string(), "decode-1".to_string(), true),
            ("prefill-0".to_string(), "decode-0".to_string(), false),
        ];
        let d = d.with_output_checks(&checks, &[]);
        assert_eq!(units(&d.localisation), ["decode-1"]);
        assert_eq!(d.matrix.cells[0][1], PathOutcome::WrongOutput);
        assert_eq!(d.failures.len(), 2);
        assert!(d.lines().join("\n").contains("WRONG"));
    }

    #[test]
    fn the_diagnosis_prints_the_grid_and_what_it_points_to() {
        let m = matrix(2, 2, vec![vec![O, T], vec![O, T]]);
        let d = Diagnosis {
            pair: "p".into(),
            localisation: localise(&m, &[]),
            matrix: m,
            failures: vec!["prefill-0 → decode-1: timed out".into()],
            took_ms: 12,
        };
        let text = d.lines().join("\n");
        assert!(text.contains("prefill-0  ok        TIMEOUT"), "{text}");
        assert!(
            text.contains("the failures point to 1 engine(s):\n  decode-1 (decode)"),
            "{text}"
        );
        assert!(text.contains("- prefill-0 → decode-1: timed out"), "{text}");
    }
}
