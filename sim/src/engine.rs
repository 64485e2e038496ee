//! The engine's timing model: pure decisions about how long a request takes.
//!
//! Nothing here sleeps, reads a clock or touches a socket: [`EngineState::admit`] is
//! handed the request's shape, the live [`Settings`] and `now` (simulated ms since
//! start) and returns a [`Plan`]. The HTTP layer carries the plan out on tokio's
//! clock. Keeping the model pure is what lets the incidents' numbers be unit tests.
//!
//! The model, in simulated milliseconds (every modelled term × the knob's slowdown,
//! × the relapse slowdown once relapsed):
//! - served alone (no prefill→decode transfer): the first token after
//!   `ttft + prompt_tokens/prefill_tok_per_s + tpot`, then one per `tpot`, so a
//!   request takes `ttft + prompt/speed + max_tokens × tpot`;
//! - the prefill of a routed pair: `ttft + prompt/speed` (then its KV is ready and
//!   it answers with one token);
//! - the decode of a routed pair: tokens start once *both* its own `ttft` (plus
//!   cold and stall) has passed and the KV has arrived, then `max_tokens × tpot` — the
//!   decode's fixed costs overlap the prefill's, so with the same flags on both the
//!   pair's end-to-end latency is the single-server formula (one cold penalty, not two);
//! - `+ cold_first_ms` on the first client generation after start;
//! - `+ stall_per_session_ms` × the live sessions other than the request's own.
//!
//! With sessions on (`--session-prefix-tokens N`), the engine also keeps the prefix
//! of the *latest* request cached (one slot): a request whose N-token prefix is the
//! cached one skips those tokens' prefill cost. Two alternating prompts therefore
//! evict each other's prefix and pay full prefill every time (INCIDENTS row 5).
//!
//! `--latency-script` entries replace the model for successive client generations
//! (the total latency, exactly, no slowdown); `hang` never answers. The health
//! check's own one-token pass costs `ttft` and never consumes the script or the cold
//! penalty. Where a slow or absent generation waits decides what health says (see
//! [`crate::http`]): a request waiting for its KV is outside the running batch and
//! health stays 200; one in the running batch that produces nothing makes it 503.
//!
//! A prefill runs in chunks (`--chunked-prefill-size`, SGLang's chunked prefill):
//! [`Admission::prefill_chunks`] splits the prompt's compute time into forward passes
//! of at most that many new tokens, the first also paying the fixed cost, so the last
//! chunk ends exactly where the single-pass model would. Each chunk is a batch result:
//! it advances `sglang:realtime_tokens_total` and answers a health check waiting on
//! the scheduler. A scripted total has no split, so its whole time is spread over the
//! chunks.
//!
//! Faults for restart verdicts, each the pure rule of a real mechanism:
//! - *Relapse* (`--relapse-after N --relapse-slowdown F`): client generation k since
//!   start (every one admitted counts, scripted ones too) is modelled F× slower when
//!   k > N. A pair that is fast right after warm-up and then degrades: a decode whose KV
//!   cache pool fills retracts running requests and recomputes them — SGLang's
//!   `Scheduler.update_running_batch` (`python/sglang/srt/managers/scheduler.py`) calls
//!   `batch.retract_decode()` when `check_decode_mem()` fails, logs "KV cache pool is
//!   full. Retract requests." and re-queues the retracted requests. Health's pass is
//!   not slowed and running requests still produce a result every (slowed) step, so
//!   health stays 200 through the relapse.
//! - *Slow and stalled KV links* (`--kv-transfer-ms`, `--kv-stall`, decode) are not
//!   costs of the plan: they are where the HTTP layer's decode part waits for its KV
//!   (see [`crate::http`]).
//! - *Failed KV transfer* (`--kv-fail-every N`, decode): routed request k (the decode
//!   part of a routed request, counted since start or since the patch that set N) fails
//!   its transfer when k is a multiple of N: requests 1..N-1 succeed, N fails, and so on.
//!   SGLang's `DecodeTransferQueue.pop_transferred`
//!   (`python/sglang/srt/disaggregation/decode.py`) meets `KVPoll.Failed` and aborts the
//!   request with HTTP 500; the HTTP layer answers it as it answers a stale bootstrap.
//! - *Cold start per restart* (`--cold-first-ms-by-start`): the first-generation penalty
//!   of the k-th start differs (page cache cold or warm, a new engine version's
//!   JIT/compile caches, CUDA graph capture after an upgrade); the server picks the
//!   start's `cold_first_ms` and this model charges it as usual.
//! - *Hang once* (`--latency-script hang,`): the first generation never answers, later
//!   ones follow the model (INCIDENTS row 2); a routed decode part hangs waiting for its
//!   KV, a request served whole hangs in the running batch. *Throughput collapse* (`--serial`,
//!   `--max-running 1`): a scheduler that stops batching; enforced by the HTTP layer's
//!   slot, not here, because it is about waiting, not cost.
//!
//! Token counting is deliberately crude: one token per whitespace-separated word
//! ([`count_tokens`]). Tests and drills control prompt size by word count.

use std::collections::VecDeque;

use crate::config::{LatencyStep, Settings};

/// Tokens in a prompt: its whitespace-separated words (at least 1 for a non-empty prompt).
pub fn count_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The session key of a prompt: its first `n` tokens (the whole prompt if shorter).
pub fn prefix_key(text: &str, n: u64) -> String {
    let words: Vec<&str> = text.split_whitespace().take(n as usize).collect();
    words.join(" ")
}

/// Which share of a request this engine computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// No transfer: prefill and decode both here.
    Whole,
    /// The prefill half of a routed request: make the KV, answer with one token.
    Prefill,
    /// The decode half of a routed request: wait for the KV, then generate.
    Decode,
}

/// What the engine knows about a client request when it admits it.
#[derive(Clone, Debug)]
pub struct Shape<'a> {
    pub prompt: &'a str,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    pub part: Part,
}

/// How a request will be answered, relative to the moment it started computing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Plan {
    /// Tokens `1..=tokens` come at `ready_ms + i × per_token_ms` (for a decode part,
    /// counted from when both `ready_ms` has passed and the KV has arrived).
    Timed {
        ready_ms: f64,
        per_token_ms: f64,
        tokens: u64,
    },
    /// Never answers.
    Hang,
}

impl Plan {
    /// Engine time the plan occupies (0 for a hang: it never completes any work).
    pub fn cost_ms(&self) -> f64 {
        match *self {
            Plan::Timed {
                ready_ms,
                per_token_ms,
                tokens,
            } => ready_ms + per_token_ms * tokens as f64,
            Plan::Hang => 0.0,
        }
    }

    /// When the first token comes, if ever (ignoring any KV wait).
    pub fn first_token_ms(&self) -> Option<f64> {
        match *self {
            Plan::Timed {
                ready_ms,
                per_token_ms,
                tokens,
            } => Some(ready_ms + if tokens > 0 { per_token_ms } else { 0.0 }),
            Plan::Hang => None,
        }
    }
}

/// The engine's decision for one client request.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub plan: Plan,
    /// The plan came from `--latency-script`.
    pub scripted: bool,
    /// The cold-start penalty was charged to this request.
    pub cold: bool,
    /// This request minted a new session.
    pub minted_session: bool,
    /// Stall added for other live sessions, simulated ms (before slowdown).
    pub stall_ms: f64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// The relapse slowdown was applied (see `--relapse-after`; never to a scripted plan).
    pub relapsed: bool,
    /// A decode part: this is routed request k (see `--kv-fail-every`).
    pub routed_seq: Option<u64>,
    /// A decode part whose KV transfer fails (see `--kv-fail-every`).
    pub kv_fail: bool,
    /// Which share of the request this engine computes.
    pub part: Part,
    /// Prompt tokens this engine computes (not served from the prefix cache); 0 for a
    /// decode part, which receives the KV instead.
    pub compute_tokens: u64,
    /// Of the plan's `ready_ms`, the time spent computing `compute_tokens` (the end of
    /// `ready_ms`; the rest is the fixed cost of the first forward pass). A scripted
    /// plan's whole `ready_ms` is prefill: the script gives only the total.
    pub prefill_ms: f64,
}

/// One chunk of a chunked prefill: a forward pass and its batch result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chunk {
    /// When the chunk's forward pass completes, simulated ms after the request started
    /// computing (the last chunk completes exactly at the plan's `ready_ms`).
    pub done_ms: f64,
    /// New prompt tokens computed by the chunk (`mode="prefill_compute"`).
    pub compute_tokens: u64,
    /// Prompt tokens the chunk took from the prefix cache (`mode="prefill_cache"`).
    pub cache_tokens: u64,
}

impl Admission {
    /// The prefill's chunks, as SGLang's chunked prefill runs them: at most
    /// `chunk_size` new tokens per forward pass (`None`: one pass), each a batch result
    /// of its own. SGLang's `Scheduler.get_new_batch_prefill`
    /// (`python/sglang/srt/managers/scheduler.py`) builds each extend batch with a
    /// `PrefillAdder` capped at `chunked_prefill_size` and keeps the rest as
    /// `chunked_req` for the next round; `process_batch_result_prefill` then reports the
    /// chunk (`report_prefill_stats` in
    /// `python/sglang/srt/managers/scheduler_components/metrics_reporter.py`:
    /// `increment_realtime_tokens(prefill_compute_tokens=log_input_tokens,
    /// prefill_cache_tokens=log_hit_tokens)`). The prefix hit is reported with the first
    /// chunk, which is where the cached prefix is matched; it does not count against the
    /// chunk budget.
    ///
    /// The chunks split the prompt's compute time in proportion to their tokens, after
    /// the fixed cost (which the first chunk pays), so the last one ends exactly at
    /// `ready_ms` and the total is the timing model's. A decode part and a hang have no
    /// chunks; a prompt served entirely from the cache has one chunk of no new tokens.
    pub fn prefill_chunks(&self, chunk_size: Option<u64>) -> Vec<Chunk> {
        let Plan::Timed { ready_ms, .. } = self.plan else {
            return Vec::new();
        };
        if self.part == Part::Decode {
            return Vec::new();
        }
        let total = self.compute_tokens;
        let fixed_ms = (ready_ms - self.prefill_ms).max(0.0);
        let size = chunk_size.filter(|c| *c > 0).unwrap_or(u64::MAX).max(1);
        let mut chunks = Vec::new();
        let mut done = 0u64;
        loop {
            let n = (total - done).min(size);
            done += n;
            let done_ms = if done >= total {
                ready_ms
            } else {
                fixed_ms + self.prefill_ms * done as f64 / total as f64
            };
            chunks.push(Chunk {
                done_ms,
                compute_tokens: n,
                cache_tokens: if chunks.is_empty() { self.cached_tokens } else { 0 },
            });
            if done >= total {
                return chunks;
            }
        }
    }
}

/// `--kv-fail-every`: whether routed request `k` (1-based) fails its KV transfer.
pub fn kv_transfer_fails(every: u64, k: u64) -> bool {
    every > 0 && k.is_multiple_of(every)
}

/// Live sessions keyed by prompt prefix (see `--session-prefix-tokens`).
#[derive(Clone, Debug, Default)]
pub struct Sessions {
    live: Vec<Session>,
    /// Sessions minted since start.
    pub minted: u64,
}

#[derive(Clone, Debug)]
struct Session {
    key: String,
    last_used_ms: f64,
}

impl Sessions {
    fn expire(&mut self, now_ms: f64, idle_ms: f64) {
        self.live.retain(|s| now_ms - s.last_used_ms <= idle_ms);
    }

    /// Sessions not idle for longer than `idle_ms` at `now_ms`.
    pub fn live(&self, now_ms: f64, idle_ms: f64) -> u64 {
        self.live.iter().filter(|s| now_ms - s.last_used_ms <= idle_ms).count() as u64
    }

    /// Uses the live session with `key`, or mints one. Returns (minted, other live sessions).
    fn touch(&mut self, key: String, now_ms: f64, idle_ms: f64) -> (bool, u64) {
        self.expire(now_ms, idle_ms);
        let minted = match self.live.iter_mut().find(|s| s.key == key) {
            Some(s) => {
                s.last_used_ms = now_ms;
                false
            }
            None => {
                self.live.push(Session {
                    key,
                    last_used_ms: now_ms,
                });
                self.minted += 1;
                true
            }
        };
        (minted, self.live.len() as u64 - 1)
    }
}

/// The engine's mutable state: what the next requests will be charged.
#[derive(Clone, Debug)]
pub struct EngineState {
    /// Remaining `--latency-script` entries.
    pub script: VecDeque<LatencyStep>,
    /// The cold-start penalty has not been charged yet.
    pub cold_pending: bool,
    pub sessions: Sessions,
    /// The prefix key of the latest request (sessions on): the one cached prefix.
    pub cached_prefix: Option<String>,
    /// Client generations admitted since start (what `--relapse-after` counts).
    pub generations: u64,
    /// Routed (decode-part) requests admitted since start, or since a patch last set
    /// `--kv-fail-every` (what that flag counts).
    pub routed: u64,
}

impl EngineState {
    pub fn new(script: VecDeque<LatencyStep>) -> EngineState {
        EngineState {
            script,
            cold_pending: true,
            sessions: Sessions::default(),
            cached_prefix: None,
            generations: 0,
            routed: 0,
        }
    }

    /// Decides how a client generation admitted at `now_ms` will be answered.
    pub fn admit(&mut self, s: &Settings, req: &Shape<'_>, now_ms: f64) -> Admission {
        let (minted_session, others, cached_tokens) = if s.session_prefix_tokens > 0 {
            let key = prefix_key(req.prompt, s.session_prefix_tokens);
            let cached = if self.cached_prefix.as_deref() == Some(key.as_str()) {
                s.session_prefix_tokens.min(req.prompt_tokens)
            } else {
                0
            };
            self.cached_prefix = Some(key.clone());
            let (minted, others) = self.sessions.touch(key, now_ms, s.session_idle_timeout_ms);
            (minted, others, cached)
        } else {
            (false, 0, 0)
        };
        let stall_ms = others as f64 * s.stall_per_session_ms;
        let compute_tokens = |req: &Shape<'_>| match req.part {
            Part::Decode => 0,
            Part::Whole | Part::Prefill => req.prompt_tokens - cached_tokens,
        };
        self.generations += 1;
        let routed_seq = (req.part == Part::Decode).then(|| {
            self.routed += 1;
            self.routed
        });
        let kv_fail = routed_seq.is_some_and(|k| kv_transfer_fails(s.kv_fail_every, k));
        let cold = std::mem::take(&mut self.cold_pending);
        let cold_ms = if cold { s.cold_first_ms } else { 0.0 };
        let tokens = match req.part {
            Part::Prefill => 1,
            Part::Whole | Part::Decode => req.max_tokens,
        };
        if let Some(step) = self.script.pop_front() {
            let plan = match step {
                LatencyStep::Ms(total) => Plan::Timed {
                    ready_ms: total,
                    per_token_ms: 0.0,
                    tokens,
                },
                LatencyStep::Hang => Plan::Hang,
            };
            let prefill_ms = match (req.part, plan) {
                (Part::Decode, _) | (_, Plan::Hang) => 0.0,
                (_, Plan::Timed { ready_ms, .. }) => ready_ms,
            };
            return Admission {
                plan,
                scripted: true,
                cold,
                minted_session,
                stall_ms,
                cached_tokens,
                relapsed: false,
                routed_seq,
                kv_fail,
                part: req.part,
                compute_tokens: compute_tokens(req),
                prefill_ms,
            };
        }
        let relapsed = s.relapsed(self.generations);
        let slow = s.slowdown_of(self.generations) * s.host_load() * if relapsed { s.relapse_slowdown } else { 1.0 };
        let prompt_ms = if s.prefill_tok_per_s > 0.0 {
            (req.prompt_tokens - cached_tokens) as f64 * 1000.0 / s.prefill_tok_per_s
        } else {
            0.0
        };
        let fixed = s.ttft_ms + cold_ms + stall_ms;
        let plan = match req.part {
            Part::Whole => Plan::Timed {
                ready_ms: (fixed + prompt_ms) * slow,
                per_token_ms: s.tpot_ms * slow,
                tokens,
            },
            Part::Prefill => Plan::Timed {
                ready_ms: (fixed + prompt_ms) * slow,
                per_token_ms: 0.0,
                tokens,
            },
            Part::Decode => Plan::Timed {
                ready_ms: fixed * slow,
                per_token_ms: s.tpot_ms * slow,
                tokens,
            },
        };
        Admission {
            plan,
            scripted: false,
            cold,
            minted_session,
            stall_ms,
            cached_tokens,
            relapsed,
            routed_seq,
            kv_fail,
            part: req.part,
            compute_tokens: compute_tokens(req),
            prefill_ms: if req.part == Part::Decode {
                0.0
            } else {
                prompt_ms * slow
            },
        }
    }

    /// The health check's one-token forward pass: `ttft` (× the knob), nothing else —
    /// no cold penalty, no script, no relapse.
    pub fn health_plan(s: &Settings) -> Plan {
        if s.fault_health_hang {
            Plan::Hang
        } else {
            Plan::Timed {
                ready_ms: s.ttft_ms * s.slowdown(),
                per_token_ms: 0.0,
                tokens: 0,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Role};

    fn settings() -> Settings {
        let mut s = Config::for_test(Role::Decode).settings;
        s.ttft_ms = 50.0;
        s.tpot_ms = 10.0;
        s.prefill_tok_per_s = 1000.0;
        s.cold_first_ms = 0.0;
        s
    }

    fn shape(prompt: &str, max_tokens: u64, part: Part) -> Shape<'_> {
        Shape {
            prompt,
            prompt_tokens: count_tokens(prompt),
            max_tokens,
            part,
        }
    }

    // Served alone, latency = ttft + prompt/speed + tokens × tpot.
    #[test]
    fn latency_model_whole() {
        let mut e = EngineState::new(VecDeque::new());
        let prompt = "w ".repeat(200);
        let a = e.admit(&settings(), &shape(&prompt, 8, Part::Whole), 0.0);
        assert_eq!(a.plan.cost_ms(), 50.0 + 200.0 + 80.0);
        assert_eq!(a.plan.first_token_ms(), Some(260.0));
    }

    // Split across a pair, the prefill pays ttft + prompt and the decode pays the tokens
    // (its own ttft overlaps the prefill's), so the pair matches the single-server formula.
    #[test]
    fn latency_model_split() {
        let s = settings();
        let prompt = "w ".repeat(200);
        let p = EngineState::new(VecDeque::new()).admit(&s, &shape(&prompt, 8, Part::Prefill), 0.0);
        let d = EngineState::new(VecDeque::new()).admit(&s, &shape(&prompt, 8, Part::Decode), 0.0);
        let Plan::Timed { ready_ms: kv_ready, .. } = p.plan else {
            panic!()
        };
        let Plan::Timed {
            ready_ms,
            per_token_ms,
            tokens,
        } = d.plan
        else {
            panic!()
        };
        assert_eq!(kv_ready, 250.0);
        assert!(ready_ms <= kv_ready);
        assert_eq!(kv_ready.max(ready_ms) + per_token_ms * tokens as f64, 330.0);
    }

    // Only the first client generation pays the cold penalty; the health pass never does.
    #[test]
    fn cold_penalty_once() {
        let mut s = settings();
        s.cold_first_ms = 1000.0;
        let mut e = EngineState::new(VecDeque::new());
        assert_eq!(EngineState::health_plan(&s).cost_ms(), 50.0);
        let first = e.admit(&s, &shape("hi", 1, Part::Whole), 0.0);
        let second = e.admit(&s, &shape("hi", 1, Part::Whole), 0.0);
        assert!(first.cold && !second.cold);
        assert_eq!(first.plan.cost_ms() - second.plan.cost_ms(), 1000.0);
    }

    // INCIDENTS row 2: the script replays 17.9 s, 106.4 s, then a hang, then normal.
    #[test]
    fn latency_script_replays_then_normal() {
        let s = settings();
        let script = crate::config::parse_latency_script("17900,106400,hang").unwrap();
        let mut e = EngineState::new(script);
        let costs: Vec<Plan> = (0..4)
            .map(|_| e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan)
            .collect();
        assert_eq!(costs[0].cost_ms(), 17900.0);
        assert_eq!(costs[1].cost_ms(), 106400.0);
        assert_eq!(costs[2], Plan::Hang);
        assert_eq!(costs[3].cost_ms(), 50.0 + 1.0 + 80.0);
    }

    // INCIDENTS row 5: fresh prompts mint a session each and every live session stalls
    // later requests; one fixed prompt reuses its session; sessions expire when idle.
    #[test]
    fn sessions_mint_stall_and_expire() {
        let mut s = settings();
        s.session_prefix_tokens = 4;
        s.session_idle_timeout_ms = 3_600_000.0;
        s.stall_per_session_ms = 100.0;
        let mut e = EngineState::new(VecDeque::new());
        for i in 0..3 {
            let p = format!("probe number {i} please answer");
            assert!(e.admit(&s, &shape(&p, 1, Part::Whole), i as f64).minted_session);
        }
        let a = e.admit(&s, &shape("probe number 2 please say more", 1, Part::Whole), 10.0);
        assert!(!a.minted_session, "shares 4 prefix tokens with a live session");
        assert_eq!(a.stall_ms, 200.0);
        assert_eq!(e.sessions.minted, 3);
        assert_eq!(e.sessions.live(10.0, s.session_idle_timeout_ms), 3);
        assert_eq!(e.sessions.live(3_600_003.0, s.session_idle_timeout_ms), 1);
        let fixed = "one fixed probe prompt";
        let mut e = EngineState::new(VecDeque::new());
        for i in 0..10 {
            e.admit(&s, &shape(fixed, 1, Part::Whole), i as f64 * 60_000.0);
        }
        assert_eq!(e.sessions.minted, 1);
    }

    // INCIDENTS row 5: one fixed prompt keeps its prefix cached; two alternating
    // prompts evict each other's and pay the full prefill every time.
    #[test]
    fn alternating_prompts_evict_the_cached_prefix() {
        let mut s = settings();
        s.session_prefix_tokens = 100;
        let a = "a ".repeat(100);
        let b = "b ".repeat(100);
        let mut fixed = EngineState::new(VecDeque::new());
        let fixed_ms: f64 = (0..6)
            .map(|_| fixed.admit(&s, &shape(&a, 1, Part::Whole), 0.0).plan.cost_ms())
            .sum();
        let mut alt = EngineState::new(VecDeque::new());
        let alt_ms: f64 = (0..6)
            .map(|i| {
                let p = if i % 2 == 0 { &a } else { &b };
                alt.admit(&s, &shape(p, 1, Part::Whole), 0.0).plan.cost_ms()
            })
            .sum();
        // ttft 50 + tpot 10 each; prefill 100 ms on a miss.
        assert_eq!(fixed_ms, 6.0 * 60.0 + 100.0);
        assert_eq!(alt_ms, 6.0 * 160.0);
        assert_eq!(alt.sessions.minted, 2);
    }

    // A live knob multiplies the modelled durations; the script stays exact.
    #[test]
    fn knob_slows_model_not_script() {
        let mut s = settings();
        s.knob_live = true;
        s.knob_slowdown = 2.0;
        let mut e = EngineState::new(crate::config::parse_latency_script("500").unwrap());
        assert_eq!(e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms(), 500.0);
        assert_eq!(
            e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms(),
            2.0 * (50.0 + 1.0 + 80.0)
        );
    }
    // --knob-tail-every: only every Nth generation pays the knob (a tail-only regression);
    // --host-load-file: the host's factor, read at each admission, on every generation.
    #[test]
    fn tail_knob_and_host_load() {
        let mut s = settings();
        s.knob_live = true;
        s.knob_slowdown = 3.0;
        s.knob_tail_every = 3;
        let warm = 50.0 + 1.0 + 80.0;
        let mut e = EngineState::new(VecDeque::new());
        let costs: Vec<f64> = (0..6)
            .map(|_| e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms())
            .collect();
        assert_eq!(costs, [warm, warm, 3.0 * warm, warm, warm, 3.0 * warm]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("load");
        s.knob_live = false;
        s.host_load_file = Some(file.clone());
        assert_eq!(
            e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms(),
            warm,
            "no file: 1"
        );
        std::fs::write(&file, "1.5\n").unwrap();
        assert_eq!(e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms(), 1.5 * warm);
        std::fs::write(&file, "nonsense").unwrap();
        assert_eq!(e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms(), warm);
    }

    // A relapse: the first N generations cost the model, every later one F× that
    // (on top of the knob), while the health pass keeps its warm cost.
    #[test]
    fn relapse_slows_generations_after_n_not_health() {
        let mut s = settings();
        s.relapse_after = Some(2);
        s.relapse_slowdown = 4.0;
        s.knob_live = true;
        s.knob_slowdown = 1.5;
        let warm = 1.5 * (50.0 + 1.0 + 80.0);
        let mut e = EngineState::new(VecDeque::new());
        let runs: Vec<Admission> = (0..4).map(|_| e.admit(&s, &shape("p", 8, Part::Whole), 0.0)).collect();
        let costs: Vec<f64> = runs.iter().map(|a| a.plan.cost_ms()).collect();
        assert_eq!(costs, [warm, warm, 4.0 * warm, 4.0 * warm]);
        assert_eq!(runs.iter().filter(|a| a.relapsed).count(), 2);
        assert_eq!(EngineState::health_plan(&s).cost_ms(), 1.5 * 50.0);
    }

    // Scripted generations count towards --relapse-after but stay exact.
    #[test]
    fn relapse_counts_scripted_generations_but_not_their_cost() {
        let mut s = settings();
        s.relapse_after = Some(1);
        s.relapse_slowdown = 2.0;
        let mut e = EngineState::new(crate::config::parse_latency_script("500,700").unwrap());
        let a: Vec<Admission> = (0..3).map(|_| e.admit(&s, &shape("p", 8, Part::Whole), 0.0)).collect();
        assert_eq!(a[0].plan.cost_ms(), 500.0);
        assert_eq!(a[1].plan.cost_ms(), 700.0);
        assert!(!a[1].relapsed, "a script entry is exact");
        assert!(a[2].relapsed);
        assert_eq!(a[2].plan.cost_ms(), 2.0 * (50.0 + 1.0 + 80.0));
    }

    // Every Nth routed request fails its transfer, deterministically: 1..N-1 succeed,
    // N fails, N+1..2N-1 succeed, 2N fails. Unrouted generations are not counted.
    #[test]
    fn kv_fail_every_nth_routed_request() {
        let mut s = settings();
        s.kv_fail_every = 3;
        let mut e = EngineState::new(VecDeque::new());
        let mut fails = Vec::new();
        for _ in 0..7 {
            e.admit(&s, &shape("alone", 1, Part::Whole), 0.0);
            let a = e.admit(&s, &shape("routed", 1, Part::Decode), 0.0);
            fails.push((a.routed_seq.unwrap(), a.kv_fail));
        }
        let expected: Vec<(u64, bool)> = (1..=7).map(|k| (k, k % 3 == 0)).collect();
        assert_eq!(fails, expected);
        assert!(!kv_transfer_fails(0, 3), "0 is off");
        s.kv_fail_every = 1;
        assert!(e.admit(&s, &shape("routed", 1, Part::Decode), 0.0).kv_fail);
    }

    // A chunked prefill: 20,000 new tokens at 1,000 tok/s in chunks of 8,192 complete
    // after the fixed 50 ms plus each chunk's share, the last exactly at ready_ms (the
    // timing model's total); chunking off is one pass; a decode part has no chunks.
    #[test]
    fn prefill_chunks_split_the_prompt_time() {
        let s = settings();
        let prompt = "w ".repeat(20_000);
        let a = EngineState::new(VecDeque::new()).admit(&s, &shape(&prompt, 8, Part::Whole), 0.0);
        let chunks = a.prefill_chunks(Some(8192));
        let at: Vec<f64> = chunks.iter().map(|c| c.done_ms).collect();
        let tokens: Vec<u64> = chunks.iter().map(|c| c.compute_tokens).collect();
        assert_eq!(at, [50.0 + 8192.0, 50.0 + 16384.0, 50.0 + 20_000.0]);
        assert_eq!(tokens, [8192, 8192, 3616]);
        let Plan::Timed { ready_ms, .. } = a.plan else { panic!() };
        assert_eq!(chunks.last().unwrap().done_ms, ready_ms);
        assert_eq!(a.prefill_chunks(None).len(), 1);
        assert_eq!(a.prefill_chunks(None)[0].done_ms, ready_ms);
        let p = EngineState::new(VecDeque::new()).admit(&s, &shape(&prompt, 8, Part::Prefill), 0.0);
        assert_eq!(p.prefill_chunks(Some(8192)).len(), 3);
        let d = EngineState::new(VecDeque::new()).admit(&s, &shape(&prompt, 8, Part::Decode), 0.0);
        assert!(d.prefill_chunks(Some(8192)).is_empty());
    }

    // The prefix hit is reported with the first chunk and does not use the chunk budget;
    // a scripted total is spread over the chunks; a hang has none.
    #[test]
    fn prefill_chunks_cache_script_and_hang() {
        let mut s = settings();
        s.session_prefix_tokens = 100;
        let prompt = "a ".repeat(300);
        let mut e = EngineState::new(VecDeque::new());
        e.admit(&s, &shape(&prompt, 1, Part::Whole), 0.0);
        let warm = e.admit(&s, &shape(&prompt, 1, Part::Whole), 0.0);
        let chunks = warm.prefill_chunks(Some(100));
        assert_eq!(
            chunks
                .iter()
                .map(|c| (c.compute_tokens, c.cache_tokens))
                .collect::<Vec<_>>(),
            [(100, 100), (100, 0)]
        );
        assert_eq!(chunks.iter().map(|c| c.done_ms).collect::<Vec<_>>(), [150.0, 250.0]);
        let s = settings();
        let mut e = EngineState::new(crate::config::parse_latency_script("9000,hang").unwrap());
        let scripted = e.admit(&s, &shape(&"w ".repeat(300), 8, Part::Whole), 0.0);
        let at: Vec<f64> = scripted.prefill_chunks(Some(100)).iter().map(|c| c.done_ms).collect();
        assert_eq!(at, [3000.0, 6000.0, 9000.0]);
        assert!(
            e.admit(&s, &shape("p", 8, Part::Whole), 0.0)
                .prefill_chunks(Some(100))
                .is_empty()
        );
    }

    // `hang,`: the one hung generation is followed by the model, cold penalty and all
    // charged to the hung one (the first after start).
    #[test]
    fn hang_once_then_model() {
        let mut s = settings();
        s.cold_first_ms = 1000.0;
        let mut e = EngineState::new(crate::config::parse_latency_script("hang,").unwrap());
        let first = e.admit(&s, &shape("p", 8, Part::Whole), 0.0);
        assert_eq!(first.plan, Plan::Hang);
        assert!(first.cold);
        let next: Vec<f64> = (0..3)
            .map(|_| e.admit(&s, &shape("p", 8, Part::Whole), 0.0).plan.cost_ms())
            .collect();
        assert_eq!(next, [131.0, 131.0, 131.0]);
    }
}
