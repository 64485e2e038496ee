//! The probes: the series through the router (or the pair's own KV path),
//! the direct proof of xPyD engines the router did not reach, and the
//! engines' and routers' counters around them (the engine and router
//! layers of the evidence).

use super::*;

/// The engine layer's evidence: each engine's PD failure counters before
/// (`None`: restarted by this operation, so from nothing) and after. A
/// scrape that failed says nothing; a counter absent from one that answered
/// is 0 (SGLang's labelled counters appear at their first increment).
pub(super) fn engine_evidence(
    pair: &PairConfig,
    before: Option<&BTreeMap<String, EngineCounterRecord>>,
    after: &BTreeMap<String, EngineCounterRecord>,
) -> Vec<EngineCounters> {
    let counts = |r: &EngineCounterRecord| {
        r.error.is_empty().then_some(EngineCounts {
            transfer_failed: r.transfer_failed_total,
            bootstrap_failed: r.bootstrap_failed_total,
        })
    };
    pair.prefill
        .iter()
        .chain(&pair.decode)
        .filter_map(|u| {
            let a = after.get(&u.unit)?;
            Some(EngineCounters {
                unit: a.unit.clone(),
                role: a.role.clone(),
                // Restarted here: it counts from 0.
                before: match before {
                    None => Some(EngineCounts {
                        transfer_failed: Some(0.0),
                        bootstrap_failed: Some(0.0),
                    }),
                    Some(b) => b.get(&u.unit).and_then(counts),
                },
                after: counts(a),
            })
        })
        .collect()
}

/// The router layer's evidence: each router's counters per worker before
/// (`None` in `before`: restarted by this operation, so from nothing) and
/// after; a router whose scrape failed on a side says nothing. `starting`:
/// a restarted router's scrape when pdwarden's verification began (issue
/// 47): the window starts there, and what it counted before is said as
/// its start-up's.
pub(super) fn router_evidence(
    pair: &PairConfig,
    before: Option<&BTreeMap<String, RouterScrape>>,
    starting: Option<&BTreeMap<String, RouterScrape>>,
    starting_own: &BTreeMap<String, u32>,
    after: &BTreeMap<String, RouterScrape>,
) -> Vec<RouterCounters> {
    pair.router
        .iter()
        .map(|u| {
            let now = after.get(&u.unit);
            let (retries_metric, errors_metric) = router_metric_names(now.map_or("", |s| s.kind.as_str()));
            let started = match before {
                None => starting.and_then(|s| s.get(&u.unit)).map(|s| s.workers.clone()),
                Some(_) => None,
            };
            // The window's traffic: from the verification's start (or the
            // operation's), or from 0 for a router started since.
            let traffic_from = match before {
                Some(b) => b.get(&u.unit).map(|s| s.traffic),
                None => Some(starting.and_then(|s| s.get(&u.unit)).and_then(|s| s.traffic)),
            };
            RouterCounters {
                traffic: match (traffic_from, now.and_then(|s| s.traffic)) {
                    (Some(from), Some(to)) => Some((from.unwrap_or_default(), to)),
                    _ => None,
                },
                unit: u.unit.clone(),
                retries_metric: retries_metric.into(),
                errors_metric: errors_metric.into(),
                before: match (before, &started) {
                    (None, Some(at_verification)) => Some(at_verification.clone()),
                    (None, None) => Some(Vec::new()),
                    (Some(b), _) => b.get(&u.unit).map(|s| s.workers.clone()),
                },
                after: now.map(|s| s.workers.clone()),
                starting: started,
                starting_own: starting_own.get(&u.unit).copied().unwrap_or(0),
            }
        })
        .collect()
}

/// One scrape of a router: the kind its metric names showed, its workers.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct RouterScrape {
    pub(super) kind: String,
    pub(super) workers: Vec<RouterWorkerCount>,
    /// Its generation requests and those it failed to their client, when it
    /// exposes them (issue 47).
    pub(super) traffic: Option<RouterTraffic>,
}

/// The names a router gives its retry and error counters, for the reasons
/// (the router profiles in `pdwarden_engines`: sglang-router 0.3's smg_*,
/// vllm-router's per-side error counters).
pub(super) fn router_metric_names(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "vllm-router" => (
            "vllm_router_retries_total",
            "vllm_router_pd_{prefill,decode}_errors_total",
        ),
        _ => ("smg_worker_retries_total", "smg_worker_errors_total"),
    }
}

impl CoRestart<'_> {
    /// The probe series through the first router: its readiness generation
    /// is probe 1 when this operation started it. A pair without a router
    /// (a rolling restart's sub-pair) is probed over its own KV path.
    pub(super) async fn probe(&mut self) {
        let Some(router) = self.pair.router.first().cloned() else {
            return self.probe_direct().await;
        };
        match self.starts.iter().position(|s| s.unit == router) {
            Some(i) => self.probe_series(i).await,
            None => self.probe_series_via(&router, Vec::new()).await,
        }
    }

    /// The probe series of a pair without a router of its own: each probe
    /// is the request a PD router sends (the chat body with the prefill's
    /// bootstrap host and port, to the prefill and the decode at once: it
    /// crosses the new prefill → decode link), sent by the prefill's agent.
    /// The URLs are the agents' registered facts; an engine whose agent does
    /// not know its URL fails the series, saying so.
    pub(super) async fn probe_direct(&mut self) {
        // A part of a pool restarted alone with one side only (issue 37):
        // its paths are proven with the pool's partner on the other side.
        let partner = self.pair.probe_partner.clone();
        let (Some(prefill), Some(decode)) = (
            self.pair.prefill.first().cloned().or_else(|| partner.clone()),
            self.pair.decode.first().cloned().or(partner),
        ) else {
            return;
        };
        let url = |u: &UnitRef| {
            self.ctx
                .agents
                .unit(&u.host, &u.unit)
                .map(|i| (i.base_url.trim_end_matches('/').to_string(), i.bootstrap_port))
                .filter(|(url, _)| !url.is_empty())
        };
        let (Some((prefill_url, bootstrap_port)), Some((decode_url, _))) = (url(&prefill), url(&decode)) else {
            self.probes.push(ProbeObservation::Error {
                message: format!("the URL of {prefill} or {decode} is unknown: its agent is not connected"),
            });
            return;
        };
        self.direct = Some(PdPath {
            decode_url,
            bootstrap_host: crate::ops::drain::url_host(&prefill_url).to_string(),
            bootstrap_port,
            prefill_url,
        });
        self.probe_series_via(&prefill, Vec::new()).await;
    }

    pub(super) fn chat_probe(&self) -> ChatProbe {
        ChatProbe {
            model: self.pair.probe.model.clone(),
            prompt: self.pair.probe.prompt.clone(),
            max_tokens: self.pair.probe.max_tokens,
            greedy: false,
        }
    }

    /// Probe 1 is the router's readiness generation; later probes go through
    /// the first router until `warm_probes` consecutive probes are warm, a
    /// probe times out (a timeout ends the series: it is decisive, and a
    /// serial engine should not be handed more work behind a stuck request),
    /// or `max_probes` have run.
    pub(super) async fn probe_series(&mut self, first_router: usize) {
        let router = &self.starts[first_router];
        let mut readiness: Vec<ProbeRecord> = router
            .generation_attempts
            .iter()
            .map(|a| ProbeRecord {
                target: format!("router:{}", router.unit.unit),
                seq: 0,
                latency_ms: Some(a.latency_ms),
                tokens: 0,
                outcome: a.outcome.clone(),
                error: if a.detail.is_empty() {
                    "readiness generation".into()
                } else {
                    format!("readiness generation: {}", a.detail)
                },
                request_id: a.request_id.clone(),
            })
            .collect();
        match (readiness.iter_mut().rev().find(|r| r.outcome == "ok"), &router.state) {
            (Some(last_ok), StartState::Generating(check)) => last_ok.tokens = check.tokens,
            (Some(_), _) => {}
            // An agent that reports no attempts: the passing check alone.
            (None, StartState::Generating(check)) => readiness.push(ProbeRecord {
                target: format!("router:{}", router.unit.unit),
                seq: 0,
                latency_ms: Some(check.latency_ms),
                tokens: check.tokens,
                outcome: "ok".into(),
                error: "readiness generation".into(),
                request_id: String::new(),
            }),
            // A start adopted after an orchestrator restart, already over
            // (`GeneratingBefore`): its check was never seen here (no
            // latency, no tokens), so it is not made up as probe 1; the
            // series starts with a real probe.
            (None, _) => {}
        }
        let unit = router.unit.clone();
        self.probe_series_via(&unit, readiness).await;
    }

    /// A verification: the probe series through the first router (over the
    /// pair's own KV path without one), nothing restarted.
    pub(super) async fn verify(&mut self) {
        self.probe().await;
    }

    /// Probes through `router`. `readiness` is the router's readiness
    /// generation after a restart (latency, tokens), which counts as probe 1.
    pub(super) async fn probe_series_via(&mut self, router: &UnitRef, readiness: Vec<ProbeRecord>) {
        let target = match &self.direct {
            Some(path) => format!("kv:{} -> {}", path.prefill_url, path.decode_url),
            None => format!("router:{}", router.unit),
        };
        let (host, unit) = (router.host.clone(), router.unit.clone());
        for mut r in readiness {
            r.seq = self.probes.len() as u32 + 1;
            let latency_ms = r.latency_ms.unwrap_or(0);
            self.probes.push(match r.outcome.as_str() {
                "ok" => ProbeObservation::Ok {
                    latency_ms,
                    tokens: r.tokens,
                },
                "timeout" => ProbeObservation::Timeout { after_ms: latency_ms },
                _ => ProbeObservation::Error {
                    message: r.error.clone(),
                },
            });
            self.rec.probe(r);
        }
        let step_idx = self.rec.step_started("probe", &unit);
        let p = self.pair.probe.clone();
        // xPyD: which engines each probe reached, by their own finished
        // counters, so that a fresh engine's first (cold) answer is told
        // from a relapse wherever in the series the router first picks it.
        let xpyd = self.pair.prefill.len() > 1 || self.pair.decode.len() > 1;
        let served = |c: &BTreeMap<String, EngineCounterRecord>| -> BTreeMap<String, f64> {
            c.iter()
                .filter_map(|(u, r)| r.requests_total.map(|n| (u.clone(), n)))
                .collect()
        };
        let mut last_counts = if xpyd {
            Some(served(&self.scrape_engines().await))
        } else {
            None
        };
        let mut reached: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        // A probe that met a fresh engine (by its counters) does not use up
        // the series: each engine is fresh once, so this adds at most one
        // probe per engine.
        let mut seq = self.probes.len() as u32;
        loop {
            seq += 1;
            if seq > p.max_probes.saturating_add(self.fresh_engine_answers.len() as u32) {
                break;
            }
            let warm_tail = self
                .probes
                .iter()
                .rev()
                .take_while(|o| matches!(o, ProbeObservation::Ok { latency_ms, .. } if *latency_ms <= p.warm_budget_ms))
                .count();
            if warm_tail >= p.warm_probes as usize
                || matches!(self.probes.last(), Some(ProbeObservation::Timeout { .. }))
            {
                break;
            }
            let (obs, record) = self.probe_once(&host, &unit, &target, seq).await;
            self.rec.probe(record);
            self.probes.push(obs);
            if let Some(before) = last_counts.as_mut() {
                let now = served(&self.scrape_engines().await);
                let first_time: Vec<&String> = now
                    .iter()
                    .filter(|(u, n)| before.get(*u).is_some_and(|b| *n > b) && !reached.contains(*u))
                    .map(|(u, _)| u)
                    .collect();
                if !first_time.is_empty() {
                    self.fresh_engine_answers.push(seq as usize);
                }
                reached.extend(first_time.into_iter().cloned());
                *before = now;
            }
        }
        self.rec.step_ended(step_idx, format!("{} probes", self.probes.len()));
    }

    /// Runs the enabled suite steps through the first router, in order, each
    /// judged on its own and against the pair's last healthy verification.
    /// One scrape of every engine of the pair (`ScrapeEngines` to each
    /// host), by unit. A unit whose agent did not answer is missing.
    pub(super) async fn scrape_engines(&self) -> BTreeMap<String, EngineCounterRecord> {
        let samples = crate::ops::drain::scrape_pair(&*self.ctx.agents, &self.pair, 2_000).await;
        let role = |unit: &UnitRef| {
            if self.pair.prefill.contains(unit) {
                "prefill"
            } else {
                "decode"
            }
        };
        self.pair
            .prefill
            .iter()
            .chain(&self.pair.decode)
            .map(|u| {
                let sample = samples.get(&u.to_string()).and_then(Option::as_ref);
                let record = EngineCounterRecord {
                    unit: u.unit.clone(),
                    role: role(u).into(),
                    transfer_failed_total: sample.and_then(|s| s.transfer_failed_total),
                    bootstrap_failed_total: sample.and_then(|s| s.bootstrap_failed_total),
                    requests_total: sample.and_then(|s| s.requests_total),
                    error: match sample {
                        None => "no answer from the agent".into(),
                        Some(s) if !s.metrics_ok => s.error.clone(),
                        Some(_) => String::new(),
                    },
                };
                (u.unit.clone(), record)
            })
            .collect()
    }

    /// The engines of an xPyD pair the verification did not reach through
    /// the router (their finished-request counter did not move from
    /// `before`, 0 for a restarted one), each proven by a PD request sent
    /// straight to it and a partner of the other side (`ProbeRequest.pd_path`):
    /// the lines for the report, and whether one of them failed.
    pub(super) async fn prove_unreached(
        &self,
        before: Option<&BTreeMap<String, EngineCounterRecord>>,
        after: &BTreeMap<String, EngineCounterRecord>,
    ) -> Vec<UnreachedProof> {
        let unreached = |u: &UnitRef| {
            after.get(&u.unit).and_then(|a| a.requests_total).is_some_and(|now| {
                let then = before
                    .and_then(|b| b.get(&u.unit))
                    .and_then(|b| b.requests_total)
                    .unwrap_or(0.0);
                now <= then
            })
        };
        let facts = |u: &UnitRef| self.ctx.agents.unit(&u.host, &u.unit);
        let mut proofs = Vec::new();
        let (Some(p0), Some(d0)) = (self.pair.prefill.first(), self.pair.decode.first()) else {
            return proofs;
        };
        let mut paths: Vec<(&UnitRef, &UnitRef)> = Vec::new();
        for d in self.pair.decode.iter().filter(|d| unreached(d)) {
            paths.push((p0, d));
        }
        // A decode's proof from prefill-0 proves prefill-0 too.
        let p0_proven = !paths.is_empty();
        for p in self
            .pair
            .prefill
            .iter()
            .filter(|p| unreached(p) && !(p0_proven && *p == p0))
        {
            paths.push((p, d0));
        }
        for (p, d) in paths {
            let (Some(pf), Some(df)) = (facts(p), facts(d)) else {
                continue;
            };
            let path = pdwarden_proto::v1::PdPath {
                decode_url: df.base_url.clone(),
                bootstrap_host: crate::ops::drain::url_host(&pf.base_url).to_string(),
                bootstrap_port: pf.bootstrap_port,
                prefill_url: String::new(),
            };
            let target = match (unreached(p), unreached(d)) {
                (true, true) => format!("{} (and {})", d.unit, p.unit),
                (_, true) => d.unit.clone(),
                _ => p.unit.clone(),
            };
            proofs.push(UnreachedProof {
                target,
                prefill: p.unit.clone(),
                decode: d.unit.clone(),
                error: crate::ops::drain::pd_probe(&*self.ctx.agents, p, &self.pair, path)
                    .await
                    .err()
                    .map(|e| e.to_string()),
            });
        }
        proofs
    }

    /// One scrape of every router of the pair (`ScrapeEngines` to its
    /// host, the router's own Prometheus port): its retry and error
    /// counters per worker, by unit. A router whose agent or metrics did
    /// not answer is missing.
    pub(super) async fn scrape_routers(&self) -> BTreeMap<String, RouterScrape> {
        let samples = crate::ops::drain::scrape_units(&*self.ctx.agents, &self.pair.router, 2_000).await;
        self.pair
            .router
            .iter()
            .filter_map(|u| {
                let s = samples.get(&u.to_string())?.as_ref().filter(|s| s.metrics_ok)?;
                let workers = s
                    .router_workers
                    .iter()
                    .map(|w| RouterWorkerCount {
                        worker: w.worker.clone(),
                        worker_type: w.worker_type.clone(),
                        retries: w.retries_total,
                        errors: w.errors_total,
                    })
                    .collect();
                Some((
                    u.unit.clone(),
                    RouterScrape {
                        kind: s.engine_kind.clone(),
                        workers,
                        traffic: s.router_requests_total.map(|requests| RouterTraffic {
                            requests,
                            failed: s.router_failed_total.unwrap_or(0.0),
                        }),
                    },
                ))
            })
            .collect()
    }

    pub(super) async fn probe_once(
        &self,
        host: &str,
        unit: &str,
        target: &str,
        seq: u32,
    ) -> (ProbeObservation, ProbeRecord) {
        let (obs, record, _) = self.probe_once_with(host, unit, target, seq, self.chat_probe()).await;
        (obs, record)
    }

    /// One probe of `chat` along the series' path; the agent's result too,
    /// when it answered (a greedy probe's answer is in it).
    pub(super) async fn probe_once_with(
        &self,
        host: &str,
        unit: &str,
        target: &str,
        seq: u32,
        chat: ChatProbe,
    ) -> (ProbeObservation, ProbeRecord, Option<pdwarden_proto::v1::ProbeResult>) {
        self.probe_along(host, unit, target, seq, chat, self.direct.clone())
            .await
    }

    /// One probe of `chat` sent by `unit`'s agent, over the KV path
    /// `pd_path` (`None`: to `unit` itself, a router); the agent's result
    /// too, when it answered.
    pub(super) async fn probe_along(
        &self,
        host: &str,
        unit: &str,
        target: &str,
        seq: u32,
        chat: ChatProbe,
        pd_path: Option<PdPath>,
    ) -> (ProbeObservation, ProbeRecord, Option<pdwarden_proto::v1::ProbeResult>) {
        // A greedy request (through the router or along a KV path) waits as
        // long as the engines progress (issue 47: on a starved host its
        // deadline passed while the engines worked, and a healthy pair was
        // called stalled), up to a long generation's timeout; engines proven
        // stuck end it at once.
        let watched = chat.greedy;
        let timeout_ms = if chat.greedy {
            output::greedy_deadline_ms(&self.pair, self.budgets.as_ref(), chat.max_tokens)
                .max(self.pair.suite.long_generation.timeout_ms)
        } else {
            self.pair.probe.probe_timeout_ms
        };
        let command_id = uuid::Uuid::new_v4().to_string();
        let cmd = Command {
            fencing_token: 0,
            command_id: command_id.clone(),
            action: Some(command::Action::Probe(ProbeRequest {
                unit: unit.into(),
                chat: Some(chat),
                timeout_ms,
                seq,
                pd_path,
            })),
        };
        let mut record = ProbeRecord {
            target: target.into(),
            seq,
            latency_ms: None,
            tokens: 0,
            outcome: "error".into(),
            error: String::new(),
            request_id: String::new(),
        };
        let started = Instant::now();
        let ask = self
            .ctx
            .agents
            .ask(host, unit, cmd, Duration::from_millis(timeout_ms), |r| match r {
                AgentReport::Probe(r) => Some(r),
                _ => None,
            });
        let result = if watched {
            tokio::select! {
                r = ask => r.map_err(|e| e.to_string()),
                why = self.engines_stall(started) => {
                    let after_ms = started.elapsed().as_millis() as u64;
                    record.outcome = "timeout".into();
                    record.error = why;
                    record.latency_ms = Some(after_ms);
                    return (ProbeObservation::Timeout { after_ms }, record, None);
                }
            }
        } else {
            ask.await.map_err(|e| e.to_string())
        };
        let mut answered = None;
        let obs = match result {
            Err(message) => {
                record.error = message.clone();
                ProbeObservation::Error { message }
            }
            Ok(r) => {
                record.request_id = r.request_id.clone();
                record.tokens = r.tokens;
                let obs = ProbeObservation::from_wire(&r);
                record.error = match &obs {
                    ProbeObservation::Error { message } if r.error.is_empty() => message.clone(),
                    _ => r.error.clone(),
                };
                record.outcome = obs.kind().into();
                record.latency_ms = Some(r.latency_ms);
                answered = Some(r);
                obs
            }
        };
        (obs, record, answered)
    }
}
