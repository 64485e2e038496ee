//! Greedy answers: what pd-sim's "model" computes, token by token, with logprobs.
//!
//! pdwarden checks output, not only timing (issue 34, "golden output"): after a
//! restart it sends one fixed greedy chat completion (temperature 0, `logprobs: true`,
//! `top_logprobs: 2`) through the router and compares the tokens with a reference
//! recorded earlier. A pair that answers fast, HTTP 200, and wrong — a decode reading
//! the transferred KV with a mismatched layout, KV pages reused too early under load, a
//! prefill and a decode on different weights — must be told from numerical noise (a
//! near-tie between the top two tokens that flips between runs). This module is the
//! pure model behind that: nothing here reads a clock, a setting or a socket.
//!
//! # The model
//! A tiny autoregressive "language model" over [`VOCAB`] (64 words). Its state starts
//! as a hash of the **weights** identity (`--weights`) and the prompt, and takes in
//! each chosen token; at each position the state ranks five distinct candidates and
//! gives them probabilities. Greedy decoding takes the first. So the answer is a pure
//! function of (weights, prompt): two engines on the same weights, or one engine
//! before and after a restart, answer the same tokens with the same logprobs; other
//! weights answer other tokens. The hash is pd-sim's own (FNV-1a and SplitMix64), not
//! Rust's `DefaultHasher`, so a reference recorded by one build still matches the next.
//!
//! - A **clear** position: the top token has probability 0.70–0.95 and the runner-up
//!   0.6 × the rest, so the top-2 margin is at least ln(0.70 / 0.18) ≈ 1.36 nats
//!   ([`CLEAR_MARGIN_MIN`] is the documented floor, 1.0).
//! - A **near-tie** position (`--near-tie-positions`): the top two are within
//!   [`NEAR_TIE_MARGIN`] (0.005 nats, under 0.01), and which of them is chosen depends
//!   on the engine's start ([`Answer::flipped`]: odd starts take one, even starts the
//!   other), as float noise would. The logprobs are reported as the engine saw them:
//!   the chosen token first. Tokens after a flip follow the new prefix.
//! - A **wrong** position (a corrupted KV read, or a prefill and a decode on different
//!   weights): the token is drawn from a different state and is never either of the
//!   healthy answer's top two at that position, with a clear margin of its own (a
//!   model that computes wrong output is as confident as one that does not).
//!
//! What makes an answer wrong ([`answer`]):
//! - `corrupt_from: Some(K)`: positions `K..` are wrong, positions before are the
//!   healthy answer's (the KV of the prompt is fine until the decode reads the pages it
//!   got wrong).
//! - `prefill_weights` different from `weights` (a routed decode whose KV came from a
//!   prefill on other weights): every position is wrong, drawn from the pair's mixed
//!   state, and differs from *both* engines' healthy answers.
//!
//! # The JSON
//! [`logprobs_json`] is OpenAI's `choices[0].logprobs` of a chat completion, as the
//! engines pdwarden runs build it:
//! - vLLM, `vllm/entrypoints/openai/protocol.py`: `ChatCompletionLogProbs { content:
//!   list[ChatCompletionLogProbsContent] | None }`, `ChatCompletionLogProbsContent
//!   (ChatCompletionLogProb) { top_logprobs: list[ChatCompletionLogProb] }`,
//!   `ChatCompletionLogProb { token: str, logprob: float, bytes: list[int] | None }`;
//! - SGLang, `python/sglang/srt/entrypoints/openai/protocol.py`: `ChoiceLogprobs {
//!   content: List[ChatCompletionTokenLogprob] }`, `ChatCompletionTokenLogprob { token,
//!   bytes: List[int], logprob, top_logprobs: List[TopLogprob] }`, `TopLogprob { token,
//!   bytes, logprob }`.
//!
//! So: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//! "logprob", "bytes"}, …]}, …]}`, one entry per generated token, `bytes` the token's
//! UTF-8 bytes, `top_logprobs` the most likely tokens at that position best first (the
//! chosen one among them, first under greedy decoding). pd-sim lists at most
//! [`MAX_TOP_LOGPROBS`] alternatives (OpenAI allows 20; the model has five).

use serde_json::{Value, json};

/// The model's vocabulary: one word (and its trailing space) per token. Two are not
/// ASCII, so that a token's `bytes` are not its characters.
pub const VOCAB: [&str; 64] = [
    "the ",
    "a ",
    "river ",
    "stone ",
    "light ",
    "cloud ",
    "winter ",
    "garden ",
    "quiet ",
    "bright ",
    "over ",
    "under ",
    "and ",
    "slowly ",
    "north ",
    "harbor ",
    "signal ",
    "paper ",
    "copper ",
    "forest ",
    "across ",
    "ember ",
    "little ",
    "silver ",
    "morning ",
    "window ",
    "orchard ",
    "lantern ",
    "meadow ",
    "falls ",
    "rises ",
    "turns ",
    "holds ",
    "keeps ",
    "finds ",
    "leaves ",
    "before ",
    "after ",
    "again ",
    "still ",
    "café ",
    "naïve ",
    "valley ",
    "thread ",
    "mirror ",
    "echo ",
    "amber ",
    "salt ",
    "iron ",
    "feather ",
    "candle ",
    "bridge ",
    "tower ",
    "field ",
    "shadow ",
    "river-bend ",
    "kettle ",
    "compass ",
    "marble ",
    "willow ",
    "ridge ",
    "ocean ",
    "dusk ",
    "dawn ",
];

/// The most `top_logprobs` entries pd-sim gives (the candidates per position).
pub const MAX_TOP_LOGPROBS: usize = 5;
/// The top-2 margin of a near-tie position, nats.
pub const NEAR_TIE_MARGIN: f64 = 0.005;
/// The least top-2 margin of a clear position, nats (the model gives ≥ 1.36).
pub const CLEAR_MARGIN_MIN: f64 = 1.0;

/// One of the most likely tokens at a position.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    pub token: &'static str,
    pub logprob: f64,
}

/// One generated token: the chosen token, its logprob, and the most likely tokens at
/// its position, best first ([`MAX_TOP_LOGPROBS`] of them; the chosen one first).
#[derive(Clone, Debug, PartialEq)]
pub struct GreedyToken {
    pub token: &'static str,
    pub logprob: f64,
    pub top: Vec<Alternative>,
}

impl GreedyToken {
    /// The top-2 margin at this position (nats).
    pub fn margin(&self) -> f64 {
        self.top[0].logprob - self.top[1].logprob
    }

    /// The runner-up token.
    pub fn runner_up(&self) -> &'static str {
        self.top[1].token
    }
}

/// What one greedy answer is computed from.
#[derive(Clone, Debug)]
pub struct Answer<'a> {
    pub prompt: &'a str,
    /// The weights identity of the engine answering.
    pub weights: &'a str,
    /// A routed decode: the weights the prefill computed the KV with (None: served
    /// alone, or the same weights).
    pub prefill_weights: Option<&'a str>,
    /// Positions (0-based) whose top two tokens are a near-tie.
    pub near_tie_positions: &'a [u64],
    /// Near-ties pick their second candidate (an even start).
    pub flipped: bool,
    /// Positions from this one on are wrong (a corrupted KV read).
    pub corrupt_from: Option<u64>,
    /// Tokens to generate.
    pub tokens: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const CORRUPT_SALT: u64 = 0xC0FF_EE00_DEAD_BEEF;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of `bytes`, seeded with `seed`, finished with SplitMix64.
fn fold(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(h)
}

/// A uniform draw in [0, 1) from `h`.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// The model's state before the first token: the weights and the prompt.
fn initial_state(weights: &str, prompt: &str) -> u64 {
    let w = fold(1, weights.as_bytes());
    fold(w, prompt.as_bytes())
}

/// The state after `token` was chosen at position `i`.
fn advance(state: u64, i: u64, token: &str) -> u64 {
    fold(state ^ i.wrapping_add(1).wrapping_mul(GOLDEN), token.as_bytes())
}

/// [`MAX_TOP_LOGPROBS`] distinct vocabulary indices drawn from `h`, none in `avoid`.
fn candidates(h: u64, avoid: &[&str]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(MAX_TOP_LOGPROBS);
    let mut k = 0u64;
    while out.len() < MAX_TOP_LOGPROBS {
        let idx = if k < 512 {
            (mix(h.wrapping_add(k.wrapping_mul(GOLDEN))) % VOCAB.len() as u64) as usize
        } else {
            // Never reached in practice; keeps the loop finite.
            (0..VOCAB.len()).find(|i| !out.contains(i)).unwrap_or(0)
        };
        k += 1;
        if !out.contains(&idx) && !avoid.contains(&VOCAB[idx]) {
            out.push(idx);
        }
    }
    out
}

/// The distribution at a position: probabilities of the candidates, best first.
fn probabilities(h: u64, near_tie: bool) -> [f64; MAX_TOP_LOGPROBS] {
    let u = unit(mix(h ^ 0x5EED));
    if near_tie {
        let p1 = 0.45 + 0.04 * u;
        let p2 = p1 * (-NEAR_TIE_MARGIN).exp();
        let r = 1.0 - p1 - p2;
        [p1, p2, 0.5 * r, 0.25 * r, 0.1 * r]
    } else {
        let p1 = 0.70 + 0.25 * u;
        let r = 1.0 - p1;
        [p1, 0.6 * r, 0.2 * r, 0.1 * r, 0.05 * r]
    }
}

fn token_at(h: u64, near_tie: bool, flipped: bool, avoid: &[&str]) -> GreedyToken {
    let mut idx = candidates(h, avoid);
    if near_tie && flipped {
        idx.swap(0, 1);
    }
    let p = probabilities(h, near_tie);
    let top: Vec<Alternative> = idx
        .iter()
        .zip(p)
        .map(|(i, p)| Alternative {
            token: VOCAB[*i],
            logprob: round6(p.ln()),
        })
        .collect();
    GreedyToken {
        token: top[0].token,
        logprob: top[0].logprob,
        top,
    }
}

/// Decodes `n` tokens from `state`. Positions `wrong_from..` are drawn from a salted
/// state and avoid the top two of every sequence in `avoid` at that position.
fn decode(
    mut state: u64,
    n: u64,
    near_tie_positions: &[u64],
    flipped: bool,
    wrong_from: Option<u64>,
    avoid: &[&[GreedyToken]],
) -> Vec<GreedyToken> {
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1 << 20));
    for i in 0..n {
        let h = mix(state ^ i.wrapping_add(1).wrapping_mul(GOLDEN));
        let t = if wrong_from.is_some_and(|k| i >= k) {
            let banned: Vec<&str> = avoid
                .iter()
                .filter_map(|seq| seq.get(i as usize))
                .flat_map(|t| [t.token, t.runner_up()])
                .collect();
            token_at(mix(h ^ CORRUPT_SALT), false, false, &banned)
        } else {
            token_at(h, near_tie_positions.contains(&i), flipped, &[])
        };
        state = advance(state, i, t.token);
        out.push(t);
    }
    out
}

/// The healthy greedy answer of `weights` to `prompt`.
pub fn healthy(weights: &str, prompt: &str, n: u64, near_tie_positions: &[u64], flipped: bool) -> Vec<GreedyToken> {
    decode(
        initial_state(weights, prompt),
        n,
        near_tie_positions,
        flipped,
        None,
        &[],
    )
}

/// The greedy answer of `a` (module doc): healthy, corrupted from a position, or that
/// of a prefill and a decode on different weights.
pub fn answer(a: &Answer<'_>) -> Vec<GreedyToken> {
    let own = healthy(a.weights, a.prompt, a.tokens, a.near_tie_positions, a.flipped);
    match a.prefill_weights.filter(|p| *p != a.weights) {
        Some(prefill) => {
            let theirs = healthy(prefill, a.prompt, a.tokens, a.near_tie_positions, a.flipped);
            let mixed = format!("{prefill}\u{1}{}", a.weights);
            decode(
                initial_state(&mixed, a.prompt),
                a.tokens,
                a.near_tie_positions,
                a.flipped,
                Some(0),
                &[&own, &theirs],
            )
        }
        None if a.corrupt_from.is_some_and(|k| k < a.tokens) => decode(
            initial_state(a.weights, a.prompt),
            a.tokens,
            a.near_tie_positions,
            a.flipped,
            a.corrupt_from,
            &[&own],
        ),
        None => own,
    }
}

/// The text of `tokens`: the tokens joined.
pub fn text(tokens: &[GreedyToken]) -> String {
    tokens.iter().map(|t| t.token).collect()
}

/// One `logprobs.content` entry (module doc) with `top_n` alternatives (at most
/// [`MAX_TOP_LOGPROBS`]).
pub fn entry_json(t: &GreedyToken, top_n: usize) -> Value {
    json!({
        "token": t.token,
        "logprob": t.logprob,
        "bytes": t.token.as_bytes(),
        "top_logprobs": t.top.iter().take(top_n.min(MAX_TOP_LOGPROBS)).map(|a| json!({
            "token": a.token,
            "logprob": a.logprob,
            "bytes": a.token.as_bytes(),
        })).collect::<Vec<_>>(),
    })
}

/// A chat completion's `choices[0].logprobs` for `tokens` (module doc).
pub fn logprobs_json(tokens: &[GreedyToken], top_n: usize) -> Value {
    json!({ "content": tokens.iter().map(|t| entry_json(t, top_n)).collect::<Vec<_>>() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "Name three rivers of Europe.";

    fn plain<'a>(weights: &'a str, n: u64) -> Answer<'a> {
        Answer {
            prompt: PROMPT,
            weights,
            prefill_weights: None,
            near_tie_positions: &[],
            flipped: false,
            corrupt_from: None,
            tokens: n,
        }
    }

    fn tokens(v: &[GreedyToken]) -> Vec<&'static str> {
        v.iter().map(|t| t.token).collect()
    }

    // The same weights and prompt give the same tokens and logprobs; every position
    // of a healthy answer is clear (top-2 margin >= 1 nat), and the distribution is one
    // (probabilities sum to at most 1, best first).
    #[test]
    fn healthy_answer_is_a_pure_function_with_clear_margins() {
        let a = answer(&plain("tiny-v1", 16));
        assert_eq!(a, answer(&plain("tiny-v1", 16)));
        assert_eq!(a.len(), 16);
        for t in &a {
            assert!(t.margin() >= 1.3, "{t:?}");
            assert_eq!(t.top.len(), MAX_TOP_LOGPROBS);
            assert_eq!(t.top[0].token, t.token);
            let p: f64 = t.top.iter().map(|x| x.logprob.exp()).sum();
            assert!(p <= 1.0 + 1e-6, "{p}");
            assert!(t.top.windows(2).all(|w| w[0].logprob > w[1].logprob));
            let mut names: Vec<_> = t.top.iter().map(|x| x.token).collect();
            names.dedup();
            assert_eq!(names.len(), MAX_TOP_LOGPROBS);
        }
        // A prefix of a longer answer is the shorter answer.
        assert_eq!(answer(&plain("tiny-v1", 4)), a[..4]);
        assert_ne!(
            tokens(&a),
            tokens(&healthy("tiny-v1", "another prompt", 16, &[], false))
        );
    }

    // Other weights: another answer from the first token on.
    #[test]
    fn other_weights_answer_otherwise() {
        let v1 = answer(&plain("tiny-v1", 8));
        let v2 = answer(&plain("tiny-v2", 8));
        assert_ne!(v1[0].token, v2[0].token);
        assert!(v1[0].margin() >= CLEAR_MARGIN_MIN);
    }

    // A corrupted read keeps the prefix and is wrong from K on: never the healthy top
    // two, at every position from K.
    #[test]
    fn corruption_is_wrong_from_k_with_clear_margins() {
        let ok = answer(&plain("tiny-v1", 10));
        for k in [0u64, 2, 5] {
            let bad = answer(&Answer {
                corrupt_from: Some(k),
                ..plain("tiny-v1", 10)
            });
            let k = k as usize;
            assert_eq!(bad[..k], ok[..k]);
            for i in k..10 {
                assert_ne!(bad[i].token, ok[i].token);
                assert_ne!(bad[i].token, ok[i].runner_up());
                assert!(ok[i].margin() >= CLEAR_MARGIN_MIN && bad[i].margin() >= CLEAR_MARGIN_MIN);
            }
        }
        // Past the end: nothing to corrupt.
        assert_eq!(
            answer(&Answer {
                corrupt_from: Some(10),
                ..plain("tiny-v1", 10)
            }),
            ok
        );
    }

    // A decode fed KV from a prefill on other weights answers neither engine's answer;
    // on the same weights, exactly the single engine's.
    #[test]
    fn mixed_weights_differ_from_both() {
        let p = answer(&plain("tiny-v1", 8));
        let d = answer(&plain("tiny-v2", 8));
        let mixed = answer(&Answer {
            prefill_weights: Some("tiny-v1"),
            ..plain("tiny-v2", 8)
        });
        for i in 0..8 {
            assert!(![p[i].token, d[i].token, p[i].runner_up(), d[i].runner_up()].contains(&mixed[i].token));
        }
        let same = answer(&Answer {
            prefill_weights: Some("tiny-v2"),
            ..plain("tiny-v2", 8)
        });
        assert_eq!(same, d);
    }

    // A near-tie position's top two are within 0.01 nats and swap with the start's
    // parity; other positions before it stay.
    #[test]
    fn near_ties_flip_with_the_start() {
        let odd = answer(&Answer {
            near_tie_positions: &[1],
            ..plain("tiny-v1", 6)
        });
        let even = answer(&Answer {
            near_tie_positions: &[1],
            flipped: true,
            ..plain("tiny-v1", 6)
        });
        assert_eq!(odd[0], even[0]);
        assert!(odd[1].margin() < 0.01 && even[1].margin() < 0.01);
        assert_eq!(odd[1].token, even[1].runner_up());
        assert_eq!(even[1].token, odd[1].runner_up());
        assert!((odd[1].logprob - even[1].logprob).abs() < 1e-9);
    }

    // Every vocabulary entry is a distinct token.
    #[test]
    fn vocabulary_is_distinct() {
        let mut v = VOCAB.to_vec();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), VOCAB.len());
    }

    // The JSON entry: token, logprob, UTF-8 bytes, and top_logprobs capped at 5.
    #[test]
    fn entry_json_shape() {
        let t = GreedyToken {
            token: "café ",
            logprob: -0.1,
            top: vec![
                Alternative {
                    token: "café ",
                    logprob: -0.1,
                },
                Alternative {
                    token: "a ",
                    logprob: -2.5,
                },
            ],
        };
        let v = entry_json(&t, 1);
        assert_eq!(
            v,
            json!({"token": "café ", "logprob": -0.1, "bytes": [99, 97, 102, 195, 169, 32],
                   "top_logprobs": [{"token": "café ", "logprob": -0.1, "bytes": [99, 97, 102, 195, 169, 32]}]})
        );
        assert_eq!(entry_json(&t, 0)["top_logprobs"], json!([]));
        assert_eq!(entry_json(&t, 20)["top_logprobs"].as_array().unwrap().len(), 2);
    }
}
