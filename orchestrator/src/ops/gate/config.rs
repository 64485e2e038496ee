//! `[pair.gate]`: the change gate's workload and tolerance. Every field is
//! optional; the defaults are a short benchmark that a pair in service
//! hardly notices.

use serde::{Deserialize, Serialize};

/// The gate's benchmark (run through the router, before and after the
/// change, identically) and how its results are judged.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateConfig {
    /// Prompt sizes, in tokens (the benchmark's prompts are that many words).
    pub prompt_tokens: Vec<u32>,
    /// Output lengths (`max_tokens`).
    pub output_tokens: Vec<u32>,
    /// Concurrency levels: requests in flight at once.
    pub concurrency: Vec<u32>,
    /// Requests per (prompt, output, concurrency) cell in one look; rounded
    /// up to whole rounds of the cell's concurrency, and never fewer than
    /// [`MIN_ROUNDS`] rounds (a round is the judge's sampling unit).
    pub requests_per_cell: u32,
    /// The measurement budget after the change: while the judge is
    /// inconclusive, another look of `requests_per_cell` is measured, up to
    /// this many requests per cell in all (the same budget holds for the
    /// measurement after a rollback).
    pub max_requests_per_cell: u32,
    /// What an inconclusive gate does once the budget is spent: "rollback"
    /// (the default: a change is kept only when shown not to regress) or
    /// "hold" (the change stays live, the gate ends `inconclusive_held`, for
    /// a person to decide).
    pub on_inconclusive: OnInconclusive,
    /// Timeout of one benchmark request.
    pub request_timeout_ms: u64,
    /// The margin, percent of the baseline: the change is kept only when
    /// every metric is shown worse by no more than this, rejected when one is
    /// shown worse by more. The default is 10: showing a p90 within 5 %
    /// takes far more than a short benchmark's 16–48 requests per cell even
    /// on a quiet pair (`pdwarden-bench --only judge`).
    pub tolerance_pct: f64,
    /// The gate's error rate: a regression beyond the margin kept, or a
    /// change within it rejected, at most this often (spread over the looks
    /// and, for rejections, over the comparisons).
    pub alpha: f64,
    pub bootstrap_resamples: u32,
    /// After a rollback, the pair is "back at baseline" when every metric is
    /// shown within this many percent of the baseline (an equivalence, not
    /// "not significantly worse"); otherwise the baseline moved.
    pub rollback_tolerance_pct: f64,
    /// A latency margin is never below this many milliseconds (for the
    /// change and for the rollback alike): a p90 that drifts by a
    /// millisecond between two runs minutes apart is the host, not the knob…
    pub min_effect_ms: f64,
    /// …but that floor is never more than this percent of the baseline (a
    /// 1 ms floor on a 1.2 ms inter-token latency would hide +60 %).
    pub min_effect_max_pct: f64,
    /// Also run the probe series and the verification suite around the
    /// benchmark (before, after, and after a rollback).
    pub verify: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            prompt_tokens: vec![16, 512],
            output_tokens: vec![64],
            concurrency: vec![1, 4],
            requests_per_cell: 16,
            max_requests_per_cell: 48,
            on_inconclusive: OnInconclusive::Rollback,
            request_timeout_ms: 120_000,
            tolerance_pct: 10.0,
            alpha: 0.05,
            bootstrap_resamples: 2_000,
            rollback_tolerance_pct: 10.0,
            min_effect_ms: 1.0,
            min_effect_max_pct: 25.0,
            verify: true,
        }
    }
}

impl GateConfig {
    /// Checks what types cannot; errors are (field, problem), the field
    /// relative to `[pair.gate]`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, p: &str| Err((f.to_string(), p.to_string()));
        for (f, v) in [
            ("prompt_tokens", &self.prompt_tokens),
            ("output_tokens", &self.output_tokens),
            ("concurrency", &self.concurrency),
        ] {
            if v.is_empty() {
                return bad(f, "needs at least one value");
            }
            if v.contains(&0) {
                return bad(f, "values must be at least 1");
            }
        }
        if self.concurrency.iter().any(|&c| c > 256) {
            return bad("concurrency", "values above 256 are not a short benchmark");
        }
        if self.requests_per_cell < 8 {
            return bad(
                "requests_per_cell",
                "must be at least 8: fewer samples cannot tell a change from noise",
            );
        }
        if self.max_requests_per_cell < self.requests_per_cell {
            return bad(
                "max_requests_per_cell",
                "must be at least requests_per_cell (it is the budget of all looks together)",
            );
        }
        if self.max_requests_per_cell > 100 * self.requests_per_cell {
            return bad(
                "max_requests_per_cell",
                "must be at most 100 looks of requests_per_cell",
            );
        }
        if !(self.min_effect_max_pct >= 0.0 && self.min_effect_max_pct.is_finite()) {
            return bad("min_effect_max_pct", "must be a finite number >= 0");
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms", "must be greater than 0");
        }
        if !(self.tolerance_pct >= 0.0 && self.tolerance_pct.is_finite()) {
            return bad("tolerance_pct", "must be a finite number >= 0");
        }
        if !(self.rollback_tolerance_pct >= 0.0 && self.rollback_tolerance_pct.is_finite()) {
            return bad("rollback_tolerance_pct", "must be a finite number >= 0");
        }
        if !(self.min_effect_ms >= 0.0 && self.min_effect_ms.is_finite()) {
            return bad("min_effect_ms", "must be a finite number >= 0");
        }
        if !(self.alpha > 0.0 && self.alpha < 0.5) {
            return bad("alpha", "must be between 0 and 0.5");
        }
        if self.bootstrap_resamples < 100 {
            return bad("bootstrap_resamples", "must be at least 100");
        }
        Ok(())
    }

    /// How many looks the budget allows.
    pub fn max_looks(&self) -> u32 {
        self.max_requests_per_cell.div_ceil(self.requests_per_cell).max(1)
    }

    /// The benchmark's cells (one look), in the order they run.
    pub fn cells(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for &prompt_tokens in &self.prompt_tokens {
            for &output_tokens in &self.output_tokens {
                for &concurrency in &self.concurrency {
                    out.push(Cell {
                        prompt_tokens,
                        output_tokens,
                        concurrency,
                        rounds: self.requests_per_cell.div_ceil(concurrency).max(MIN_ROUNDS),
                    });
                }
            }
        }
        out
    }
}

/// The fewest rounds a cell has in one look: the judge resamples rounds,
/// and four rounds (16 requests at concurrency 4) give a bootstrap only 35
/// distinct resamples.
pub const MIN_ROUNDS: u32 = 8;

/// What a gate that is still inconclusive at the end of its budget does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnInconclusive {
    #[default]
    Rollback,
    Hold,
}

/// One benchmark cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub concurrency: u32,
    pub rounds: u32,
}

impl Cell {
    pub fn label(&self) -> String {
        format!(
            "prompt {} / output {} / concurrency {}",
            self.prompt_tokens, self.output_tokens, self.concurrency
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_cells_cover_the_grid() {
        let c = GateConfig::default();
        c.validate().unwrap();
        let cells = c.cells();
        assert_eq!(cells.len(), 4);
        assert_eq!(cells[1].concurrency, 4);
        assert_eq!(
            cells[1].rounds, MIN_ROUNDS,
            "16 requests at concurrency 4: still 8 rounds"
        );
        assert_eq!(cells[0].rounds, 16);
        assert_eq!(c.max_looks(), 3);
    }

    #[test]
    fn errors_name_the_field() {
        let mut c = GateConfig {
            concurrency: vec![],
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "concurrency");
        c.concurrency = vec![1];
        c.requests_per_cell = 3;
        assert_eq!(c.validate().unwrap_err().0, "requests_per_cell");
        c.requests_per_cell = 8;
        c.max_requests_per_cell = 4;
        assert_eq!(c.validate().unwrap_err().0, "max_requests_per_cell");
        c.max_requests_per_cell = 8;
        c.alpha = 0.0;
        assert_eq!(c.validate().unwrap_err().0, "alpha");
    }
}
