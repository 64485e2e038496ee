//! The verification suite through the router (long generation, multi-turn,
//! concurrency, abort storm), its budgets from the pair's history, and its
//! steps' raw samples.

use super::*;
use pdwarden_model::judge::wedge::UnitTrack;
use pdwarden_proto::v1::{CutSuiteStep, EngineSample};

/// How long a cut step's agent has to acknowledge the cut, and then to
/// send back the cut requests' samples.
const CUT_ANSWER_WAIT: Duration = Duration::from_secs(5);

pub(super) fn sample_from_wire(s: pdwarden_proto::v1::SuiteRequestSample) -> RequestSample {
    let outcome = match ProbeOutcome::try_from(s.outcome).unwrap_or(ProbeOutcome::Unspecified) {
        ProbeOutcome::Ok => SampleOutcome::Ok,
        ProbeOutcome::Timeout => SampleOutcome::Timeout,
        _ => SampleOutcome::Error,
    };
    RequestSample {
        index: s.index,
        outcome,
        latency_ms: s.latency_ms,
        ttft_ms: s.ttft_ms,
        tokens: s.tokens,
        error: s.error,
        aborted: s.aborted,
        token_times_ms: s.token_times_ms,
        request_id: s.request_id,
        tokens_asked: s.tokens_asked,
        finish_reason: s.finish_reason,
        stream_error: s.stream_error,
    }
}

impl CoRestart<'_> {
    /// The suite's budgets, from this operation's warm answers and the
    /// pair's last healthy verifications (the config's numbers override).
    pub(super) fn suite_budgets(&self) -> SuiteBudgets {
        let cfg = &self.pair.suite;
        let warm = self.pair.probe.warm_budget_ms;
        let history_tpot_us = healthy_suites(&self.ctx.journal, &self.pair.name)
            .into_iter()
            .filter_map(|(op, steps)| {
                let lg = steps.iter().find(|s| s.step == SuiteStep::LongGeneration)?;
                Some((op, *lg.figures.get("tpot_us")?))
            })
            .filter(|(_, us)| *us > 0)
            .collect();
        let history_batching = healthy_suites(&self.ctx.journal, &self.pair.name)
            .into_iter()
            .filter_map(|(op, steps)| {
                let c = steps.iter().find(|s| s.step == SuiteStep::Concurrency)?;
                let (slowest, single) = (*c.figures.get("slowest_ms")?, *c.figures.get("single_request_ms")?);
                (single > 0).then(|| (op, slowest as f64 / single as f64))
            })
            .collect();
        suite::derive_budgets(&BudgetInputs {
            history_batching,
            warm_budget_ms: warm,
            probe_max_tokens: self.pair.probe.max_tokens,
            warm_answers_ms: self
                .probes
                .iter()
                .filter_map(|p| match p {
                    ProbeObservation::Ok { latency_ms, .. } if *latency_ms <= warm => Some(*latency_ms),
                    _ => None,
                })
                .collect(),
            history_tpot_us,
            ttft_override_ms: cfg.ttft_budget_ms,
            tpot_override_ms: cfg.tpot_budget_ms,
            gap_override_ms: cfg.long_generation.max_token_gap_ms,
            slowest_override_ms: cfg.concurrency.slowest_budget_ms,
            tpot_history_ratio: cfg.tpot_history_ratio,
            min_batching_gain: cfg.min_batching_gain,
            engines_batch: cfg.concurrency.engines_batch,
            floor_ms: cfg.baseline_floor_ms,
        })
    }

    /// Runs the enabled suite steps in order and stops at the first that
    /// proves a wedge or a failure (issue 30: nine more requests against a
    /// proven wedge only delay the verdict): the steps run, and those not.
    pub(super) async fn verification_suite(
        &mut self,
        abort_storm: bool,
    ) -> Result<(Vec<StepReport>, Vec<SuiteStep>), crate::ops::journal::JournalError> {
        let cfg = self.pair.suite.clone();
        let mut plan: Vec<SuiteStep> = Vec::new();
        if cfg.long_generation.enabled {
            plan.push(SuiteStep::LongGeneration);
        }
        if cfg.multi_turn.enabled {
            plan.push(SuiteStep::MultiTurn);
        }
        if cfg.concurrency.enabled {
            plan.push(SuiteStep::Concurrency);
        }
        if abort_storm {
            plan.push(SuiteStep::AbortStorm);
        }
        // A pair without a router (a rolling restart's sub-pair): its suite
        // runs with the whole pair's verification, through the router.
        if plan.is_empty() || self.pair.router.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let baseline = last_healthy_suite(&self.ctx.journal, &self.pair.name);
        let budgets = self.suite_budgets();
        self.rec.journal_entry(self.rec.now_ms(), "suite_budgets", &budgets);
        self.budgets = Some(budgets.clone());
        let router = self.pair.router[0].clone();
        let chat = self.chat_probe();
        let mut steps: Vec<StepReport> = Vec::new();
        let mut plan = plan.into_iter();
        for step in plan.by_ref() {
            let (request, timeout_ms) = match step {
                SuiteStep::LongGeneration => (
                    suite_step_request::Step::LongGeneration(SuiteLongGeneration {
                        chat: Some(ChatProbe {
                            max_tokens: cfg.long_generation.max_tokens,
                            ..chat.clone()
                        }),
                        timeout_ms: cfg.long_generation.timeout_ms,
                        // A silence alone proves nothing (SGLang retracting
                        // requests when its KV pool is full, vLLM's recompute
                        // preemption: the stream pauses and resumes): the
                        // engines' progress decides, and the step is cut
                        // when they stop (issue 47, `suite_step_watched`).
                        silence_timeout_ms: cfg.long_generation.timeout_ms,
                    }),
                    cfg.long_generation.timeout_ms,
                ),
                SuiteStep::MultiTurn => (
                    suite_step_request::Step::MultiTurn(SuiteMultiTurn {
                        chat: Some(chat.clone()),
                        second_prompt: cfg.multi_turn.second_prompt.clone(),
                        timeout_ms: cfg.multi_turn.timeout_ms,
                    }),
                    2 * cfg.multi_turn.timeout_ms,
                ),
                SuiteStep::Concurrency => (
                    suite_step_request::Step::Concurrency(SuiteConcurrency {
                        chat: Some(chat.clone()),
                        requests: cfg.concurrency.requests,
                        timeout_ms: cfg.concurrency.timeout_ms,
                    }),
                    cfg.concurrency.timeout_ms,
                ),
                SuiteStep::AbortStorm => (
                    suite_step_request::Step::AbortStorm(SuiteAbortStorm {
                        chat: Some(chat.clone()),
                        requests: cfg.abort_storm.requests,
                        prompt_tokens: cfg.abort_storm.prompt_tokens,
                        abort_after_ms: cfg.abort_storm.abort_after_ms,
                        probe_timeout_ms: cfg.abort_storm.probe_timeout_ms,
                    }),
                    cfg.abort_storm.abort_after_ms + cfg.abort_storm.probe_timeout_ms,
                ),
            };
            let step_idx = self
                .rec
                .step_started(&format!("verify-{}", step.as_str()), &router.unit);
            let (samples, stalled) = if step == SuiteStep::AbortStorm {
                // Its requests are abandoned on purpose; its own probe
                // judges what they leave behind.
                (self.suite_step(&router, request, timeout_ms).await, None)
            } else {
                self.suite_step_watched(&router, request, timeout_ms).await
            };
            let mut report = match step {
                SuiteStep::LongGeneration => suite::judge_long_generation(samples, &budgets),
                SuiteStep::MultiTurn => suite::judge_multi_turn(samples, &budgets, cfg.multi_turn.ttft_budget_ms),
                SuiteStep::Concurrency => suite::judge_concurrency(samples, &budgets),
                SuiteStep::AbortStorm => suite::judge_abort_storm(samples, &budgets),
            };
            if let Some(why) = stalled {
                report = suite::stalled(report, why);
            }
            let base = baseline
                .as_ref()
                .and_then(|(op, steps)| steps.iter().find(|s| s.step == step).map(|s| (op, s)))
                .map(|(op, s)| Baseline {
                    operation_id: op.clone(),
                    figures: s.figures.clone(),
                });
            suite::compare_with_baseline(
                &mut report,
                base.as_ref(),
                cfg.baseline_warning_ratio,
                cfg.baseline_floor_ms,
            );
            self.rec.journal_entry(self.rec.now_ms(), "suite_step", &report);
            let status = match report.status {
                suite::StepStatus::Pass => "pass",
                suite::StepStatus::Warn => "warn",
                suite::StepStatus::Fail => "fail",
            };
            let detail = if report.reasons.is_empty() {
                report.summary()
            } else {
                report.reasons.join("; ")
            };
            self.rec.step_ended(step_idx, format!("{status}: {detail}"));
            let proven = matches!(report.fails_as, Some(VerdictKind::Wedged | VerdictKind::Failed));
            steps.push(report);
            if proven {
                break;
            }
        }
        Ok((steps, plan.collect()))
    }

    /// Resolves only when the pair's engines are proven stuck since
    /// `started` (issue 47: slow vs stuck by the engines' own progress):
    /// scrapes every engine every quarter of the watch's stall budget and
    /// folds the samples as the wedge watch does; the sentence of
    /// [`suite::engines_stalled`] once it has one. Pending for ever while
    /// any engine progresses or the evidence cannot say; the caller races
    /// it against what it waits for.
    pub(super) async fn engines_stall(&self, started: Instant) -> String {
        let budget = Duration::from_millis(self.pair.watch.stall_budget_ms);
        let every = (budget / 4).clamp(Duration::from_millis(250), Duration::from_secs(1));
        let engines: Vec<&UnitRef> = self.pair.prefill.iter().chain(&self.pair.decode).collect();
        let mut tracks: Vec<UnitTrack> = engines
            .iter()
            .map(|u| {
                let role = if self.pair.prefill.contains(u) {
                    "prefill"
                } else {
                    "decode"
                };
                UnitTrack::new(u.unit.clone(), role)
            })
            .collect();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut samples =
                crate::ops::drain::scrape_pair(&*self.ctx.agents, &self.pair, every.as_millis() as u64 * 2).await;
            let at = Instant::now();
            // An agent that did not answer says nothing of its engines:
            // this round is not judged (its silence is not theirs).
            let answered: Option<Vec<EngineSample>> = engines
                .iter()
                .map(|u| samples.remove(&u.to_string()).flatten())
                .collect();
            let Some(answered) = answered else { continue };
            for (track, sample) in tracks.iter_mut().zip(answered) {
                // Its processes' CPU: a busy engine is working (a JIT
                // compile), whatever its counters say.
                if let Some(cpu) = sample.process_cpu_seconds {
                    track.observe_cpu(at, cpu);
                }
                track.observe(
                    crate::ops::watcher::wedge_sample(sample, None, at),
                    self.pair.watch.engine,
                );
            }
            if let Some(why) = suite::engines_stalled(&tracks, started, at, budget) {
                return why;
            }
        }
    }

    /// Sends one suite step to the router's agent while the pair's engines
    /// are scraped every quarter of the watch's stall budget (issue 47: slow
    /// vs stuck by the engines' own progress). Engines that progress, the
    /// clients' requests or the step's own, let the step wait as long as
    /// its requests may; engines flat for the stall budget
    /// ([`suite::engines_stalled`]) are stuck: the step is cut where it is
    /// (`CutSuiteStep`) and its samples come back with the proof.
    pub(super) async fn suite_step_watched(
        &self,
        router: &UnitRef,
        step: suite_step_request::Step,
        timeout_ms: u64,
    ) -> (Vec<RequestSample>, Option<String>) {
        let command_id = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        let answer = self.suite_step_as(&command_id, router, step, timeout_ms);
        tokio::pin!(answer);
        let watch = self.engines_stall(started);
        let why = tokio::select! {
            samples = &mut answer => return (samples, None),
            why = watch => why,
        };
        let cut = Command {
            fencing_token: 0,
            command_id: uuid::Uuid::new_v4().to_string(),
            action: Some(command::Action::CutSuiteStep(CutSuiteStep {
                command_id: command_id.clone(),
                reason: why.clone(),
            })),
        };
        let cut_answer = self
            .ctx
            .agents
            .ask(&router.host, &router.unit, cut, CUT_ANSWER_WAIT, |r| match r {
                AgentReport::Result(r) => Some(r),
                _ => None,
            })
            .await;
        // The cut requests answer at once; an agent that could not cut
        // (an older one, the step just ended) is not waited for long.
        let samples = match cut_answer {
            Ok(r) if r.ok => tokio::time::timeout(CUT_ANSWER_WAIT, &mut answer)
                .await
                .unwrap_or_default(),
            _ => tokio::time::timeout(Duration::from_millis(200), &mut answer)
                .await
                .unwrap_or_default(),
        };
        (samples, Some(why))
    }

    /// Sends one suite step to the router's agent and waits for its samples.
    pub(super) async fn suite_step(
        &self,
        router: &UnitRef,
        step: suite_step_request::Step,
        timeout_ms: u64,
    ) -> Vec<RequestSample> {
        self.suite_step_as(&uuid::Uuid::new_v4().to_string(), router, step, timeout_ms)
            .await
    }

    async fn suite_step_as(
        &self,
        command_id: &str,
        router: &UnitRef,
        step: suite_step_request::Step,
        timeout_ms: u64,
    ) -> Vec<RequestSample> {
        let command_id = command_id.to_string();
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::SuiteStep(SuiteStepRequest {
                unit: router.unit.clone(),
                step: Some(step),
            })),
        };
        let failed = |error: String| {
            vec![RequestSample {
                index: 0,
                outcome: SampleOutcome::Error,
                latency_ms: 0,
                ttft_ms: 0,
                tokens: 0,
                error,
                aborted: false,
                token_times_ms: Vec::new(),
                request_id: String::new(),
                tokens_asked: 0,
                finish_reason: String::new(),
                stream_error: String::new(),
            }]
        };
        let answer = self
            .ctx
            .agents
            .ask(
                &router.host,
                &router.unit,
                cmd,
                Duration::from_millis(timeout_ms),
                |r| match r {
                    AgentReport::Suite(r) => Some(r),
                    _ => None,
                },
            )
            .await;
        match answer {
            Ok(r) => r.samples.into_iter().map(sample_from_wire).collect(),
            Err(e) => failed(e.to_string()),
        }
    }
}
