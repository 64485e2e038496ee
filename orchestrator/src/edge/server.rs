//! The orchestrator process: the gRPC edge (`AgentLink` for agents, `Control`
//! for the CLI) around the fleet registry, the journal and the operations.
//!
//! `serve` takes its listener and shutdown signal as arguments (mini-redis
//! style) so tests run the real server in-process on `127.0.0.1:0`. Errors of
//! the library become `tonic::Status` only here.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pdwarden_proto::v1::{
    HistoryRequest, JsonReply, OperationUpdate, RestartPairRequest, RestartUnitRequest, StatusRequest,
    VerifyPairRequest,
    agent_link_server::AgentLinkServer,
    control_server::{Control, ControlServer},
    operation_update,
};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status};

use crate::config::{OrchestratorConfig, PairConfig, UnitRef};
use crate::edge::fleet::{AgentLinkService, Fleet};
use crate::edge::tls::AgentAuth;
use crate::ops::corestart::{OperationContext, OperationKind, run_operation};
use crate::ops::journal::{Journal, JournalError};
use crate::ops::watcher::WatchBoard;
use pdwarden_model::status::{OperationRecord, OperatorAuth, PairStatus, SecurityView, StatusView, TransportView};
use pdwarden_model::watch::PairWatchView;
use pdwarden_security::tls::Transport;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Tls(#[from] pdwarden_security::tls::TlsError),
    #[error(transparent)]
    ServerTls(#[from] crate::edge::tls::ServerTlsError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// This orchestrator stopped leading (issue 19). Final for the process:
    /// nothing of its term may act again.
    #[error(
        "lost the leadership: {0}; exiting so that nothing of this term acts again (the service manager starts this orchestrator again, as a follower); running units were not touched"
    )]
    Deposed(String),
    #[error(
        "journal {0}: this build has no etcd support; build pdwarden-orchestrator with `--features etcd` (needs protoc: scripts/setup-etcd.sh)"
    )]
    EtcdNotBuilt(String),
    #[error("cannot listen for readiness on {addr}")]
    Readiness {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The `Control` service the CLI talks to.
#[derive(Clone)]
pub struct ControlService {
    config: Arc<OrchestratorConfig>,
    ctx: OperationContext,
    /// The agents as `status` shows them (the runtime reaches them through
    /// `ctx.agents`, the same fleet behind the port).
    fleet: Fleet,
    /// The watch's latest view of each pair (issue 5).
    watch: WatchBoard,
    /// Hides secret environment values in everything this service returns.
    redactor: pdwarden_security::redact::Redactor,
    security: SecurityView,
}

/// The caller the auth layer identified (absent only for a service built
/// without it, in tests).
fn actor<T>(request: &Request<T>) -> Option<crate::edge::auth::Actor> {
    request.extensions().get::<crate::edge::auth::Actor>().cloned()
}

/// Forwards an operation's updates to the caller with secrets redacted, and
/// journals who asked for each operation that starts (issue 8).
fn forward(
    ctx: &OperationContext,
    redactor: &pdwarden_security::redact::Redactor,
    actor: Option<crate::edge::auth::Actor>,
    mut rx: mpsc::UnboundedReceiver<OperationUpdate>,
) -> UpdateStream {
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (journal, redactor) = (ctx.journal.clone(), redactor.clone());
    tokio::spawn(async move {
        while let Some(mut u) = rx.recv().await {
            match &mut u.kind {
                Some(operation_update::Kind::Started(s)) => {
                    if let Some(a) = &actor
                        && let Err(e) = journal.append(&s.operation_id, 0, "actor", a)
                    {
                        tracing::error!(operation = %s.operation_id, error = %e, "cannot journal the operation's actor");
                    }
                    tracing::info!(operation = %s.operation_id, pair = %s.pair, actor = ?actor, "operation started");
                }
                Some(operation_update::Kind::Report(r)) => {
                    if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&r.json) {
                        redactor.json(&mut v);
                        r.json = v.to_string();
                    }
                }
                Some(operation_update::Kind::Phase(p)) => p.detail = redactor.text(&p.detail),
                Some(operation_update::Kind::Step(st)) => st.outcome = redactor.text(&st.outcome),
                _ => {}
            }
            let _ = out_tx.send(Ok(u));
        }
    });
    UnboundedReceiverStream::new(out_rx)
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// The most hosts one `status` may name.
pub const MAX_STATUS_HOSTS: usize = 1024;

/// A request field out of bounds (issue 32): `field: problem`, one line
/// that never quotes the value whole, as the caller's error.
fn bounded(field: &str, checked: Result<(), pdwarden_model::fields::FieldError>) -> Result<(), Status> {
    checked.map_err(|problem| Status::invalid_argument(format!("{field}: {problem}")))
}

/// A request's idempotency key: empty is "none"; otherwise the CLI's rule.
fn check_request_id(request_id: &str) -> Result<(), Status> {
    if request_id.is_empty() {
        return Ok(());
    }
    bounded("request_id", pdwarden_model::fields::check_request_id(request_id))
}

/// A request's pair name (the config's rule).
fn check_pair(pair: &str) -> Result<(), Status> {
    bounded("pair", pdwarden_model::fields::check_name(pair))
}

impl ControlService {
    /// `status --json`, redacted, for every host or only `hosts`.
    fn status_json(&self, hosts: Option<&BTreeSet<String>>, detail: bool) -> Result<String, Status> {
        // A follower has no agents (they attach to the leader): a
        // whole-fleet status is the leader's, as it published it to the
        // shared store, with this orchestrator's own role (issue 36: the
        // leader's load does not grow with readers).
        if hosts.is_none()
            && !detail
            && let pdwarden_model::status::Role::Follower { .. } = self.fleet.leadership.role()
            && let Some(json) = self.published_status()
        {
            return Ok(json);
        }
        self.own_status_json(hosts, detail)
    }

    /// The leader's published summary, if fresh, with this follower's role.
    fn published_status(&self) -> Option<String> {
        let (text, age_ms) = self.ctx.journal.published(STATUS_PUBLISHED).ok().flatten()?;
        if !published_is_fresh(age_ms) {
            return None;
        }
        let mut v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["leadership"] = serde_json::to_value(self.fleet.leadership.role()).ok()?;
        v["published"] = serde_json::json!({ "age_ms": age_ms });
        Some(v.to_string())
    }

    /// This orchestrator's own status (see `status_json`).
    fn own_status_json(&self, hosts: Option<&BTreeSet<String>>, detail: bool) -> Result<String, Status> {
        let mut pairs = Vec::new();
        let pending = self.ctx.journal.pending_conclusions();
        // An unreadable journal (etcd without a quorum) is said, not an
        // error: status is how an operator learns why nothing moves.
        let mut journal_unreadable = None;
        for p in &self.config.pairs {
            let hist = match journal_unreadable {
                Some(_) => Vec::new(),
                None => self.ctx.journal.history(&p.name, 5).unwrap_or_else(|e| {
                    journal_unreadable = Some(e.to_string());
                    Vec::new()
                }),
            };
            let running = hist.iter().find(|r| r.ended_unix_ms.is_none());
            let last = hist.iter().find(|r| r.ended_unix_ms.is_some());
            pairs.push(PairStatus {
                name: p.name.clone(),
                running_operation: running.map(|r| r.operation_id.clone()),
                last_operation: last.map(|r| r.operation_id.clone()),
                last_verdict: last.and_then(|r| r.verdict.clone()),
                journal_error: pending.iter().find(|c| c.pair == p.name).cloned(),
            });
        }
        let mut agents = self.fleet.status(hosts);
        let reports: BTreeMap<String, Arc<pdwarden_model::host::HostReport>> = agents
            .iter()
            .filter_map(|a| a.host_report.clone().map(|r| (a.host.clone(), r)))
            .collect();
        // Each unit's queued requests from the engine watch, so an idle
        // GPU under a queue is a finding (`gpu_idle_with_queue`).
        let mut findings = crate::edge::hoststate::findings_over(
            &reports,
            &self.watch.queued_by_host(),
            crate::edge::hoststate::now_unix_ms(),
        );
        // A large fleet's whole status is its numbers and the hosts that
        // need a look (issue 36); `--detail` or `--host` for the rest.
        let fleet = pdwarden_model::status::summarise(&mut agents, &mut findings, hosts.is_none() && !detail);
        let view = StatusView {
            findings,
            fleet,
            agents,
            pairs,
            watch: self.watch.all(),
            leadership: self.fleet.leadership.role(),
            journal: self.config.journal.to_string(),
            journal_unreadable,
            security: self.security.clone(),
            published: None,
        };
        self.redactor.to_json_string(&view).map_err(internal)
    }
    /// A follower takes no mutating call: it answers with the leader's
    /// address (issue 19).
    fn leads(&self) -> Result<(), Status> {
        match self.fleet.leadership.refusal() {
            None => Ok(()),
            Some(why) => {
                let mut status = Status::unavailable(why);
                if let pdwarden_model::status::Role::Follower {
                    leader_url: Some(url), ..
                } = self.fleet.leadership.role()
                    && let Ok(v) = url.parse()
                {
                    status.metadata_mut().insert(pdwarden_proto::LEADER_METADATA, v);
                }
                Err(status)
            }
        }
    }

    /// The preflight (`ops::preflight`): every agent attached and knowing
    /// its units, and for an operation that restarts, every unit startable
    /// now; refused with every reason, nothing touched.
    async fn preflight(&self, pair: &crate::config::PairConfig, restarts: bool) -> Result<(), Status> {
        crate::ops::preflight::check(&self.fleet, pair, restarts)
            .await
            .map_err(|r| match r.unreachable {
                true => Status::unavailable(r.to_string()),
                false => Status::failed_precondition(r.to_string()),
            })
    }
}

type UpdateStream = UnboundedReceiverStream<Result<OperationUpdate, Status>>;

/// The opening entry that makes an operator's co-restart capture the
/// pair's evidence first (issue 35): when the watch judged the pair
/// wedged, suspect or held. Pure.
fn capture_opening(view: Option<&PairWatchView>) -> Option<(&'static str, serde_json::Value)> {
    let view = view.filter(|v| matches!(v.state.as_str(), "wedged" | "suspect" | "held"))?;
    let why = format!(
        "the operator restarted a pair the watch judged {}: {}",
        view.state,
        view.reasons.join("; ")
    );
    Some((crate::ops::forensics::OPENING, serde_json::json!({ "why": why })))
}

/// A journal refusal as the operator sees it (one mapping for every
/// operation start).
fn begin_refused(e: JournalError) -> Status {
    match e {
        e @ JournalError::PairBusy { .. } => Status::failed_precondition(e.to_string()),
        e @ JournalError::DuplicateRequest { .. } => Status::already_exists(e.to_string()),
        e @ JournalError::ConclusionPending { .. } => Status::unavailable(e.to_string()),
        e => internal(e),
    }
}

/// What an operation start runs: a co-restart or verification, or a
/// rolling restart.
enum Started {
    Operation(OperationKind),
    Rolling,
    /// Only the engines the path matrix names (issue 37).
    Repair,
}

impl ControlService {
    /// Validates, journals and spawns an operation on a pair; returns its
    /// live update stream. The one start path of co-restarts,
    /// verifications and rolling restarts (a rolling restart is refused in
    /// one line when the pair cannot be rolled, before anything is
    /// journaled). `opening`: entries journaled with the operation before
    /// it runs (a verification's `--record-reference`).
    async fn start_operation(
        &self,
        pair: &str,
        request_id: &str,
        what: Started,
        actor: Option<crate::edge::auth::Actor>,
        opening: &[(&str, serde_json::Value)],
    ) -> Result<Response<UpdateStream>, Status> {
        self.leads()?;
        let pair = self.config.pair(pair).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.config.pairs.iter().map(|p| p.name.as_str()).collect();
            Status::not_found(format!("unknown pair {:?} (configured: {})", pair, known.join(", ")))
        })?;
        match what {
            Started::Rolling => {
                crate::ops::rolling::check(&pair).map_err(|e| Status::failed_precondition(e.to_string()))?
            }
            Started::Repair => {
                crate::ops::repair::check(&pair).map_err(|e| Status::failed_precondition(e.to_string()))?
            }
            Started::Operation(_) => {}
        }
        let restarts = matches!(
            what,
            Started::Rolling | Started::Repair | Started::Operation(OperationKind::CoRestart)
        );
        self.preflight(&pair, restarts).await?;
        let kind = match &what {
            Started::Operation(kind) => kind.as_str(),
            Started::Rolling => crate::ops::rolling::KIND,
            Started::Repair => crate::ops::repair::KIND,
        };
        let request_id = (!request_id.is_empty()).then_some(request_id);
        // An operator's restart of a pair the watch judged wedged keeps its
        // evidence first, as an automatic recovery does (issue 35).
        let mut opening = opening.to_vec();
        if let Started::Operation(OperationKind::CoRestart) | Started::Rolling | Started::Repair = what {
            opening.extend(capture_opening(self.watch.get(&pair.name).as_ref()));
        }
        let operation_id = self
            .ctx
            .begin(kind, &pair.name, request_id, &opening)
            .map_err(begin_refused)?;
        let (tx, rx) = mpsc::unbounded_channel();
        // The operation runs on its own task: a CLI that disconnects does not
        // cancel a half-done restart.
        let (ctx, journal, id) = (self.ctx.clone(), self.ctx.journal.clone(), operation_id.clone());
        match what {
            Started::Operation(kind) => {
                crate::ops::spawn_guarded(journal, id, run_operation(ctx, pair, operation_id, kind, tx));
            }
            Started::Rolling => {
                crate::ops::spawn_guarded(journal, id, crate::ops::rolling::run(ctx, pair, operation_id, tx));
            }
            Started::Repair => {
                let repair = crate::ops::repair::run(ctx, pair, operation_id, false, tx);
                crate::ops::spawn_guarded(journal, id, repair);
            }
        }
        Ok(Response::new(forward(&self.ctx, &self.redactor, actor, rx)))
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    type RestartPairStream = UnboundedReceiverStream<Result<OperationUpdate, Status>>;
    type RestartUnitStream = UnboundedReceiverStream<Result<OperationUpdate, Status>>;
    type VerifyPairStream = UnboundedReceiverStream<Result<OperationUpdate, Status>>;
    type GatePairStream = UnboundedReceiverStream<Result<OperationUpdate, Status>>;

    async fn gate_pair(
        &self,
        request: Request<pdwarden_proto::v1::GatePairRequest>,
    ) -> Result<Response<Self::GatePairStream>, Status> {
        let actor = actor(&request);
        let req = request.into_inner();
        // Everything the request alone can be refused for, before the
        // preflight and before anything is measured (issue 32, finding 3).
        check_pair(&req.pair)?;
        check_request_id(&req.request_id)?;
        pdwarden_model::gate::config::ChangeArgs::of(&req.set_env, &req.unset_env, &req.set_args, &req.units)
            .validate()
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.leads()?;
        let pair = self
            .config
            .pair(&req.pair)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("unknown pair {:?}", req.pair)))?;
        self.preflight(&pair, true).await?;
        let change = pdwarden_model::gate::change::ChangeSpec {
            set_env: req.set_env.into_iter().collect(),
            unset_env: req.unset_env,
            set_args: req.set_args.into_iter().collect(),
            units: req.units,
        };
        let request_id = (!req.request_id.is_empty()).then_some(req.request_id.as_str());
        let rx = match crate::ops::gate::start(&self.ctx, &pair, request_id, change) {
            Ok(rx) => rx,
            Err(crate::ops::gate::GateStartError::Invalid(e)) => return Err(Status::invalid_argument(e.to_string())),
            Err(crate::ops::gate::GateStartError::Journal(e)) => return Err(begin_refused(e)),
        };
        Ok(Response::new(forward(&self.ctx, &self.redactor, actor, rx)))
    }

    async fn restart_pair(
        &self,
        request: Request<RestartPairRequest>,
    ) -> Result<Response<Self::RestartPairStream>, Status> {
        let actor = actor(&request);
        let req = request.into_inner();
        check_pair(&req.pair)?;
        check_request_id(&req.request_id)?;
        let what = match (req.rolling, req.only_sick) {
            (true, true) => {
                return Err(Status::invalid_argument(
                    "--rolling and --only-sick: choose one (a roll restarts every sub-pair; --only-sick only the engines the path matrix names)",
                ));
            }
            (true, false) => Started::Rolling,
            (false, true) => Started::Repair,
            (false, false) => Started::Operation(OperationKind::CoRestart),
        };
        self.start_operation(&req.pair, &req.request_id, what, actor, &[]).await
    }

    async fn verify_pair(
        &self,
        request: Request<VerifyPairRequest>,
    ) -> Result<Response<Self::VerifyPairStream>, Status> {
        let actor = actor(&request);
        let req = request.into_inner();
        check_pair(&req.pair)?;
        check_request_id(&req.request_id)?;
        let kind = OperationKind::Verify {
            include_abort_storm: req.include_abort_storm,
        };
        // The operator pins this verification's greedy answer as the
        // pair's reference (issue 34): journaled with it, so that a resumed
        // verification pins too.
        let pin = [(crate::ops::corestart::RECORD_REFERENCE, serde_json::json!(true))];
        let opening: &[(&str, serde_json::Value)] = if req.record_reference { &pin } else { &[] };
        self.start_operation(&req.pair, &req.request_id, Started::Operation(kind), actor, opening)
            .await
    }

    async fn restart_unit(
        &self,
        request: Request<RestartUnitRequest>,
    ) -> Result<Response<Self::RestartUnitStream>, Status> {
        let actor = actor(&request);
        let req = request.into_inner();
        if !req.host.is_empty() {
            bounded("host", pdwarden_model::fields::check_name(&req.host))?;
        }
        bounded("unit", pdwarden_model::fields::check_name(&req.unit))?;
        check_request_id(&req.request_id)?;
        tracing::info!(unit = %req.unit, host = %req.host, actor = ?actor, "restart unit requested");
        for pair in &self.config.pairs {
            let is = |units: &[crate::config::UnitRef]| {
                units
                    .iter()
                    .any(|u| u.unit == req.unit && (req.host.is_empty() || u.host == req.host))
            };
            if is(&pair.decode) {
                return Err(Status::failed_precondition(format!(
                    "refused: {} is the decode of pd-pair {}. A decode-only restart against a running prefill leaves the KV-transfer bootstrap degraded and every request wedges (INCIDENTS row 1). Run `pdwarden restart pd-pair {}` for an ordered co-restart (prefill, then decode, then router).",
                    req.unit, pair.name, pair.name
                )));
            }
            if is(&pair.prefill) {
                return Err(Status::failed_precondition(format!(
                    "refused: {} is the prefill of pd-pair {}. Restarting prefill under a running decode breaks the decode's cached bootstrap and every transfer fails. Run `pdwarden restart pd-pair {}`.",
                    req.unit, pair.name, pair.name
                )));
            }
            if is(&pair.router) {
                return Err(Status::unimplemented(format!(
                    "a router-only restart is not supported yet; `pdwarden restart pd-pair {}` restarts {} after its engines",
                    pair.name, req.unit
                )));
            }
        }
        Err(Status::not_found(format!(
            "unit {:?} is not part of any configured pair; pdwarden restarts units only as part of a pair",
            req.unit
        )))
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<JsonReply>, Status> {
        // A `base_url` with `user:pass@` is for those who may operate (issue 32).
        let sees_credentials = actor(&request).is_some_and(|a| a.sees_url_credentials());
        let req = request.into_inner();
        if req.hosts.len() > MAX_STATUS_HOSTS {
            return Err(Status::invalid_argument(format!(
                "hosts: {} given; at most {MAX_STATUS_HOSTS}",
                req.hosts.len()
            )));
        }
        for h in &req.hosts {
            bounded("hosts", pdwarden_model::fields::check_name(h))?;
        }
        let detail = req.detail;
        let hosts: Option<BTreeSet<String>> = (!req.hosts.is_empty()).then(|| req.hosts.into_iter().collect());
        if let Some(hosts) = &hosts
            && let Some(unknown) = hosts.iter().find(|h| !self.fleet.knows_host(h))
        {
            return Err(Status::not_found(format!(
                "hosts: no agent has attached from host {unknown:?} (`pdwarden status` lists the hosts)"
            )));
        }
        // A fleet-wide status is megabytes of JSON: built off the runtime's
        // workers, so the agents' streams are not held up behind it.
        let this = self.clone();
        let json = tokio::task::spawn_blocking(move || {
            let json = this.status_json(hosts.as_ref(), detail)?;
            if sees_credentials {
                return Ok(json);
            }
            let hidden = match crate::edge::auth::hide_url_credentials(&json) {
                std::borrow::Cow::Owned(hidden) => Some(hidden),
                std::borrow::Cow::Borrowed(_) => None,
            };
            Ok::<_, Status>(hidden.unwrap_or(json))
        })
        .await
        .map_err(internal)??;
        Ok(Response::new(JsonReply { json }))
    }

    async fn diagnose_pair(
        &self,
        request: Request<pdwarden_proto::v1::DiagnosePairRequest>,
    ) -> Result<Response<JsonReply>, Status> {
        let req = request.into_inner();
        check_pair(&req.pair)?;
        self.leads()?;
        let pair = self
            .config
            .pair(&req.pair)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("unknown pair {:?}", req.pair)))?;
        let reference = crate::ops::corestart::output::current_reference(&self.ctx.journal, &pair);
        let d = crate::ops::diagnose::diagnose(&*self.ctx.agents, &pair, &[], reference.as_ref())
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(JsonReply {
            json: self.redactor.to_json_string(&d).map_err(internal)?,
        }))
    }

    async fn history(&self, request: Request<HistoryRequest>) -> Result<Response<JsonReply>, Status> {
        let caller = actor(&request);
        let req = request.into_inner();
        // A capture's contents are for forensics and operate (issue 48):
        // refused before anything about the operation is said.
        if !req.evidence.is_empty() && !caller.as_ref().is_some_and(crate::edge::auth::Actor::may_read_captures) {
            return Err(crate::edge::auth::capture_refused(caller.as_ref()));
        }
        check_pair(&req.pair)?;
        if self.config.pair(&req.pair).is_none() {
            return Err(Status::not_found(format!("unknown pair {:?}", req.pair)));
        }
        if !req.evidence.is_empty() {
            return self.evidence(&req.pair, &req.evidence).map(Response::new);
        }
        let limit = if req.limit == 0 { 20 } else { req.limit.min(1000) };
        let records: Vec<OperationRecord> = self.ctx.journal.history(&req.pair, limit).map_err(internal)?;
        let mut json = serde_json::to_value(&records).map_err(internal)?;
        self.redactor.json(&mut json);
        Ok(Response::new(JsonReply { json: json.to_string() }))
    }
}

impl ControlService {
    /// `history PAIR --evidence OP`: the capture operation `OP` of `pair`
    /// took before it stopped the pair (issue 35), redacted.
    fn evidence(&self, pair: &str, operation_id: &str) -> Result<JsonReply, Status> {
        bounded("evidence", pdwarden_model::fields::check_request_id(operation_id))?;
        let journal = &self.ctx.journal;
        match journal.meta(operation_id).map_err(internal)? {
            Some(m) if m.pair == pair => {}
            Some(m) => {
                return Err(Status::not_found(format!(
                    "operation {operation_id} is pair {:?}'s, not {pair:?}'s",
                    m.pair
                )));
            }
            None => return Err(Status::not_found(format!("no operation {operation_id} in the journal"))),
        }
        let mut captures: Vec<serde_json::Value> = journal
            .read(operation_id, crate::ops::forensics::ENTRY)
            .map_err(internal)?;
        let Some(mut capture) = captures.pop() else {
            return Err(Status::not_found(format!(
                "operation {operation_id} of pair {pair:?} kept no evidence: it did not stop a pair judged wedged, or its capture was forgotten (the newest {} per pair are kept, for {} days)",
                crate::ops::forensics::RETAIN_CAPTURES,
                crate::ops::forensics::RETAIN_AGE_MS / (24 * 3600 * 1000)
            )));
        };
        self.redactor.json(&mut capture);
        Ok(JsonReply {
            json: capture.to_string(),
        })
    }
}

/// Takes over the operations an earlier orchestrator process left running
/// (DESIGN.md 4). Co-restarts and verifications of configured pairs are
/// resumed once every agent of the pair has re-attached (nothing is restarted
/// before their facts are re-read); anything else — or a pair whose agents do
/// not come back within the grace period — is concluded `failed`, saying why.
fn resume_interrupted(ctx: &OperationContext, config: &OrchestratorConfig) -> Result<(), JournalError> {
    let unfinished = ctx.journal.unfinished()?;
    // Pairs whose rolling restart is taken over below: it resumes its own
    // child in flight (on `PAIR#roll`).
    let rolling: BTreeSet<String> = unfinished
        .iter()
        .filter(|o| o.kind == crate::ops::rolling::KIND && config.pair(&o.pair).is_some())
        .map(|o| format!("{}{}", o.pair, crate::ops::rolling::CHILD_SUFFIX))
        .collect();
    // Likewise a repair's (issue 37), on `PAIR#repair`.
    let repairs: BTreeSet<String> = unfinished
        .iter()
        .filter(|o| o.kind == crate::ops::repair::KIND && config.pair(&o.pair).is_some())
        .map(|o| format!("{}{}", o.pair, crate::ops::repair::CHILD_SUFFIX))
        .collect();
    for op in unfinished {
        let pair = config.pair(&op.pair).cloned();
        match (op.kind.as_str(), pair) {
            (crate::ops::rolling::KIND, Some(pair)) => {
                tracing::warn!(operation = %op.operation_id, pair = %op.pair, state = %op.state, "taking over interrupted rolling restart once its agents re-attach");
                let (ctx, grace) = (ctx.clone(), Duration::from_millis(config.resume_grace_ms));
                let (journal, id) = (ctx.journal.clone(), op.operation_id.clone());
                crate::ops::spawn_guarded(journal, id, async move {
                    if agents_reattached(&ctx, &pair, &op, grace).await {
                        crate::ops::rolling::resume(ctx, pair, op).await;
                    } else {
                        crate::ops::rolling::abandon(
                            &ctx.journal,
                            &pair,
                            "its rolling restart could not be resumed: its agents did not re-attach",
                        );
                    }
                });
            }
            (crate::ops::repair::KIND, Some(pair)) => {
                tracing::warn!(operation = %op.operation_id, pair = %op.pair, state = %op.state, "taking over interrupted repair once its agents re-attach");
                let (ctx, grace) = (ctx.clone(), Duration::from_millis(config.resume_grace_ms));
                let (journal, id) = (ctx.journal.clone(), op.operation_id.clone());
                crate::ops::spawn_guarded(journal, id, async move {
                    if agents_reattached(&ctx, &pair, &op, grace).await {
                        crate::ops::repair::resume(ctx, pair, op).await;
                    } else {
                        crate::ops::repair::abandon(
                            &ctx.journal,
                            &pair,
                            "its repair could not be resumed: its agents did not re-attach",
                        );
                    }
                });
            }
            // A roll's or a repair's own child: its parent, taken over
            // above, resumes it.
            _ if rolling.contains(&op.pair) || repairs.contains(&op.pair) => {}
            ("gate", Some(pair)) => {
                tracing::warn!(operation = %op.operation_id, pair = %op.pair, state = %op.state, "taking over interrupted gate once its agents re-attach");
                let (ctx, grace) = (ctx.clone(), Duration::from_millis(config.resume_grace_ms));
                let (journal, id) = (ctx.journal.clone(), op.operation_id.clone());
                crate::ops::spawn_guarded(journal, id, async move {
                    if !agents_reattached(&ctx, &pair, &op, grace).await {
                        return;
                    }
                    if let Err(reason) = crate::ops::gate::resume_gate(ctx.clone(), pair, op.clone()).await
                        && let Err(e) = conclude_failed(&ctx.journal, &op, reason.to_string())
                    {
                        tracing::error!(operation = %op.operation_id, error = %e, "could not conclude interrupted gate");
                    }
                });
            }
            ("co_restart" | "verify", Some(pair)) => {
                tracing::warn!(operation = %op.operation_id, pair = %op.pair, state = %op.state, "resuming interrupted operation once its agents re-attach");
                let (journal, id) = (ctx.journal.clone(), op.operation_id.clone());
                crate::ops::spawn_guarded(
                    journal,
                    id,
                    resume_one(ctx.clone(), pair, op, Duration::from_millis(config.resume_grace_ms)),
                );
            }
            // A gate's own co-restart: the gate, taken over above, rolls
            // its change back with a co-restart of its own.
            _ if op.pair.ends_with("#gate") => conclude_failed(
                &ctx.journal,
                &op,
                format!(
                    "interrupted by an orchestrator restart while part of a change gate (state {}); the gate is taken over and rolls its change back",
                    op.state
                ),
            )?,
            _ => conclude_failed(
                &ctx.journal,
                &op,
                format!(
                    "the orchestrator stopped while this {} operation was in state {}; it cannot be resumed and was concluded: check the pair's units",
                    op.kind, op.state
                ),
            )?,
        }
    }
    Ok(())
}

fn conclude_failed(journal: &Journal, op: &OperationRecord, reason: String) -> Result<(), JournalError> {
    tracing::warn!(operation = %op.operation_id, pair = %op.pair, %reason, "concluding interrupted operation as failed");
    let report = serde_json::json!({
        "operation_id": op.operation_id,
        "pair": op.pair,
        "kind": op.kind,
        "verdict": "failed",
        "reasons": [reason],
    });
    journal.conclude(&op.operation_id, "failed", &report)
}

/// Waits until every agent of `pair` has re-attached with its units; after
/// `grace`, concludes `op` failed naming the missing ones and returns false.
async fn agents_reattached(ctx: &OperationContext, pair: &PairConfig, op: &OperationRecord, grace: Duration) -> bool {
    let units: Vec<UnitRef> = pair
        .prefill
        .iter()
        .chain(&pair.decode)
        .chain(&pair.router)
        .cloned()
        .collect();
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        let missing: Vec<String> = units
            .iter()
            .filter(|u| !ctx.agents.is_connected(&u.host) || ctx.agents.unit(&u.host, &u.unit).is_none())
            .map(|u| u.to_string())
            .collect();
        if missing.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let reason = format!(
                "the orchestrator restarted while this operation was in state {}; not resumed: {} not re-attached within {} ms",
                op.state,
                missing.join(", "),
                grace.as_millis()
            );
            if let Err(e) = conclude_failed(&ctx.journal, op, reason) {
                tracing::error!(operation = %op.operation_id, error = %e, "could not conclude interrupted operation");
            }
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

async fn resume_one(ctx: OperationContext, pair: PairConfig, op: OperationRecord, grace: Duration) {
    if !agents_reattached(&ctx, &pair, &op, grace).await {
        return;
    }
    crate::ops::corestart::resume(ctx, pair, op).await;
}

/// The journal `config` names, with who acts on it.
struct Opened {
    journal: Arc<Journal>,
    leadership: crate::edge::leadership::Leadership,
    /// On etcd: the election to run (it resolves with why the leadership
    /// was lost); none for a sole orchestrator.
    election: Option<Task<String>>,
    /// On etcd: resigns the leadership (a planned shutdown) and resolves
    /// once the lease is given back.
    resign: Option<Resign>,
}

/// A boxed future of the server's own tasks.
type Task<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// Starts resigning the leadership; the future resolves once the lease is
/// given back (see `Opened::resign`).
type Resign = Box<dyn FnOnce() -> Task<()> + Send>;

fn open_journal(config: &OrchestratorConfig, holder: &str) -> Result<Opened, ServeError> {
    match &config.journal {
        crate::config::JournalSpec::Sqlite(path) => Ok(Opened {
            journal: Arc::new(Journal::own(path, holder)?),
            leadership: crate::edge::leadership::Leadership::sole(),
            election: None,
            resign: None,
        }),
        #[cfg(feature = "etcd")]
        crate::config::JournalSpec::Etcd(endpoints) => {
            let l = config
                .leadership
                .clone()
                .ok_or_else(|| crate::config::ConfigError::Invalid {
                    field: "leadership.advertise_url".into(),
                    problem: "required with an etcd journal".into(),
                })?;
            // An agent that lost the leader waits at a follower for about
            // two leases: the next leader is elected within one.
            let leadership = crate::edge::leadership::Leadership::candidate(
                &l.advertise_url,
                Duration::from_secs(2 * l.lease_ttl_s + 2),
            );
            let fence = Arc::new(crate::ops::journal::etcd::Fence::new(leadership.clone()));
            let store = crate::ops::journal::etcd::EtcdStore::connect(
                endpoints,
                &l.prefix,
                Duration::from_millis(l.etcd_timeout_ms),
                l.etcd_tls.as_ref(),
                fence.clone(),
            )?;
            let election = crate::edge::election::Election {
                client: store.client(),
                leader_key: store.leader_key(),
                ttl_s: l.lease_ttl_s,
                fence: fence.clone(),
                leadership: leadership.clone(),
            };
            let resign: Resign = Box::new(move || {
                fence.lose("resigned: this orchestrator is shutting down");
                Box::pin(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(2), fence.released()).await;
                })
            });
            tracing::info!(journal = %config.journal, url = %l.advertise_url, "campaigning for the leadership on etcd");
            Ok(Opened {
                journal: Arc::new(Journal::new(Box::new(store))),
                leadership,
                election: Some(Box::pin(election.run())),
                resign: Some(resign),
            })
        }
        #[cfg(not(feature = "etcd"))]
        spec @ crate::config::JournalSpec::Etcd(_) => Err(ServeError::EtcdNotBuilt(spec.to_string())),
    }
}

/// Resolves with why the election task ended (it ends only when the
/// leadership is lost).
async fn election_ended(election: &mut tokio::task::JoinHandle<String>) -> String {
    match election.await {
        Ok(why) => why,
        Err(e) => format!("the election task failed ({e})"),
    }
}

/// The leader's work (see `serve`): resumes the interrupted operations,
/// retries refused conclusions, starts the pairs' watches. Returns the
/// tasks to stop with the term.
fn take_over(
    ctx: &OperationContext,
    config: &OrchestratorConfig,
    board: &WatchBoard,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, JournalError> {
    resume_interrupted(ctx, config)?;
    // Conclusions a full disk refused are written as soon as it allows.
    let retry = {
        let journal = ctx.journal.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                let j = journal.clone();
                let _ = tokio::task::spawn_blocking(move || j.flush_pending()).await;
            }
        })
    };
    let mut tasks = crate::ops::watcher::spawn_all(ctx, &config.pairs, board, stop_rx);
    tasks.push(retry);
    tasks.push(spawn_retention(
        ctx.journal.clone(),
        config.retention,
        board.operations.clone(),
    ));
    Ok(tasks)
}

/// The name the leader publishes its whole-fleet status under.
const STATUS_PUBLISHED: &str = "status";
/// How often the leader publishes it, and how old a follower still shows it.
const PUBLISH_STATUS_EVERY: Duration = Duration::from_secs(2);
const PUBLISHED_STATUS_FRESH_MS: i64 = 10_000;

/// Whether a published view `age_ms` old (the follower's clock less the
/// leader's stamp) is fresh enough to answer with. A negative age is a
/// stamp from the future — the leader's clock ahead of this one, or a
/// forged entry — and is stale (issue 48, item 6): counted as fresh, it
/// stayed so for as long as the stamp lasted, so a follower could answer
/// `status` and `/ready` with a view minutes or days old.
fn published_is_fresh(age_ms: i64) -> bool {
    (0..=PUBLISHED_STATUS_FRESH_MS).contains(&age_ms)
}

/// While this orchestrator leads on etcd, its whole-fleet status summary is
/// published to the shared store every 2 s for the followers to answer
/// `status` with (issue 36). A publish that fails is tried at the next tick.
fn spawn_status_publisher(control: ControlService) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(PUBLISH_STATUS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if !control.fleet.leadership.leads() {
                continue;
            }
            let c = control.clone();
            let published = tokio::task::spawn_blocking(move || {
                let json = c.own_status_json(None, false).map_err(|s| s.message().to_string())?;
                c.ctx
                    .journal
                    .publish(STATUS_PUBLISHED, &json)
                    .map_err(|e| e.to_string())
            })
            .await;
            if let Ok(Err(e)) = published {
                tracing::debug!(error = %e, "cannot publish the status for the followers");
            }
        }
    })
}

/// While this orchestrator follows on etcd, its watch board (what its
/// readiness endpoint answers) mirrors the leader's published views every
/// 2 s (issue 36: readers of readiness need not reach the leader); stale or
/// unreadable, it holds none, and no pair is ready here.
fn spawn_follower_mirror(control: ControlService) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(PUBLISH_STATUS_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if control.fleet.leadership.leads() {
                continue;
            }
            let c = control.clone();
            let views = tokio::task::spawn_blocking(move || {
                let (text, age_ms) = c.ctx.journal.published(STATUS_PUBLISHED).ok().flatten()?;
                published_is_fresh(age_ms).then(|| published_watch(&text))
            })
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
            if !control.fleet.leadership.leads() {
                control.watch.mirror(views);
            }
        }
    })
}

/// The watch views of a published status. Pure.
fn published_watch(text: &str) -> Vec<pdwarden_model::watch::PairWatchView> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::from_value(v["watch"].clone()).ok())
        .unwrap_or_default()
}

/// The retention pass (issue 36), while this orchestrator leads: a minute
/// after it takes over, then every `interval_ms`; each pass's outcome and
/// the journal's size go to the `pdwarden_journal_*` series. A pass that
/// fails is logged and tried again at the next.
fn spawn_retention(
    journal: Arc<Journal>,
    policy: crate::ops::journal::RetentionPolicy,
    metrics: crate::ops::telemetry::OperationMetrics,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let mut every = tokio::time::interval(Duration::from_millis(policy.interval_ms));
        loop {
            every.tick().await;
            let j = journal.clone();
            let started = tokio::time::Instant::now();
            let pass = tokio::task::spawn_blocking(move || (j.retain_now(&policy), j.size())).await;
            let took = started.elapsed();
            let Ok((retained, size)) = pass else { continue };
            let size = size
                .map_err(|e| tracing::warn!(error = %e, "cannot read the journal's size"))
                .ok();
            match retained {
                Ok(r) => {
                    tracing::info!(
                        compacted = r.compacted,
                        removed = r.removed,
                        took_ms = took.as_millis() as u64,
                        ?size,
                        "journal retention pass"
                    );
                    metrics.retained(r.compacted, r.removed, size.map(|s| (s.operations, s.entries, s.bytes)));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "journal retention pass failed; tried again at the next");
                    metrics.retained(0, 0, size.map(|s| (s.operations, s.entries, s.bytes)));
                }
            }
        }
    })
}

/// Bounds on the connections the gRPC server holds (issue 32, finding 4):
/// 260 idle TCP connections and half-finished TLS handshakes under a
/// 256-descriptor limit once left `pdwarden status` unable to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A TLS handshake not finished within this is dropped.
    pub tls_handshake: Duration,
    /// A connection nothing is read from for this long is closed: one that
    /// never speaks, or stops mid-handshake. A live HTTP/2 peer is read
    /// from at least every `http2_keepalive_interval` (the answers to the
    /// server's pings), so this must be longer than the interval plus its
    /// timeout; `serve_with_limits` raises it to that if it is not.
    pub idle: Duration,
    /// HTTP/2 pings after this long without a frame from the peer…
    pub http2_keepalive_interval: Duration,
    /// …and the connection closed when one is not answered within this.
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive probes after this long idle (a peer that vanished
    /// without a FIN, before HTTP/2 is up).
    pub tcp_keepalive: Duration,
    /// At most this many connections at once: past it, a connection is
    /// closed as it is accepted, so the orchestrator never runs out of
    /// descriptors (its journal and readiness endpoint need some too).
    pub max_connections: usize,
    /// Concurrent requests (HTTP/2 streams) on one connection.
    pub per_connection_requests: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            tls_handshake: Duration::from_secs(10),
            idle: Duration::from_secs(30),
            http2_keepalive_interval: Duration::from_secs(10),
            http2_keepalive_timeout: Duration::from_secs(5),
            tcp_keepalive: Duration::from_secs(30),
            max_connections: max_connections_for(open_files_limit()),
            per_connection_requests: 256,
        }
    }
}

/// This process's soft limit on open descriptors (`RLIMIT_NOFILE`), read
/// from `/proc/self/limits`; `None` where unreadable or unlimited.
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The connection cap for a descriptor limit: a quarter of it (at least 64)
/// kept for everything else, between 16 and 16384 connections; 4096 when
/// the limit is unknown.
fn max_connections_for(open_files: Option<usize>) -> usize {
    match open_files {
        Some(n) => n.saturating_sub((n / 4).max(64)).clamp(16, 16_384),
        None => 4_096,
    }
}

/// The accepted connections, within [`ConnectionLimits`]: each holds a
/// permit of the cap while it lives, and is closed once idle too long.
struct Incoming {
    accept: tonic::transport::server::TcpIncoming,
    permits: Arc<tokio::sync::Semaphore>,
    idle: Duration,
    /// After an accept failed for want of descriptors or memory: the
    /// pending connection stays queued and would fail again at once.
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Connections closed at the cap, for the log.
    refused: u64,
}

impl Incoming {
    fn new(listener: TcpListener, limits: &ConnectionLimits) -> Self {
        Incoming {
            accept: tonic::transport::server::TcpIncoming::from(listener)
                .with_nodelay(Some(true))
                .with_keepalive(Some(limits.tcp_keepalive))
                .with_keepalive_interval(Some(Duration::from_secs(10)))
                .with_keepalive_retries(Some(3)),
            permits: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
            idle: limits.idle,
            pause: None,
            refused: 0,
        }
    }
}

impl Stream for Incoming {
    type Item = std::io::Result<Guarded>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::{Poll, ready};
        let this = &mut *self;
        loop {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(std::pin::Pin::new(&mut this.accept).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(tcp)) => match this.permits.clone().try_acquire_owned() {
                    Ok(permit) => return Poll::Ready(Some(Ok(Guarded::new(tcp, permit, this.idle)))),
                    Err(_) => {
                        this.refused += 1;
                        if this.refused.is_power_of_two() {
                            tracing::warn!(
                                peer = ?tcp.peer_addr().ok(),
                                refused = this.refused,
                                "connection cap reached: closing new connections until some close"
                            );
                        }
                        drop(tcp);
                    }
                },
                Some(Err(e)) => {
                    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted, WouldBlock};
                    if !matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock) {
                        tracing::warn!(error = %e, "cannot accept a connection; pausing accepts for 100 ms");
                        this.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(100))));
                    }
                }
            }
        }
    }
}

/// An accepted TCP connection that holds a permit of the connection cap and
/// fails its reads once nothing was read from the peer for `idle`.
struct Guarded {
    io: tokio::net::TcpStream,
    idle: Duration,
    last_read: tokio::time::Instant,
    /// Wakes the reader when `idle` may have passed; re-armed from
    /// `last_read` rather than on every read.
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Guarded {
    fn new(io: tokio::net::TcpStream, permit: tokio::sync::OwnedSemaphorePermit, idle: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Guarded {
            io,
            idle,
            last_read: now,
            deadline: Box::pin(tokio::time::sleep_until(now + idle)),
            _permit: permit,
        }
    }
}

impl Connected for Guarded {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last_read = tokio::time::Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => loop {
                if this.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let due = this.last_read + this.idle;
                if tokio::time::Instant::now() >= due {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("nothing read from the peer for {:?}: closed", this.idle),
                    )));
                }
                this.deadline.as_mut().reset(due);
            },
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// How long after the shutdown signal open streams (attached agents,
/// followed operations) may take to end before the server drops them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the orchestrator on `listener` until `shutdown` resolves, then at
/// most [`SHUTDOWN_GRACE`] more, within the default [`ConnectionLimits`].
pub async fn serve(
    listener: TcpListener,
    config: OrchestratorConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_with_limits(listener, config, ConnectionLimits::default(), shutdown).await
}

/// [`serve`] within `limits` (tests shorten them).
pub async fn serve_with_limits(
    listener: TcpListener,
    config: OrchestratorConfig,
    mut limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    // A live peer answers a ping within interval + timeout: never idle longer.
    limits.idle = limits
        .idle
        .max(limits.http2_keepalive_interval + limits.http2_keepalive_timeout + Duration::from_millis(100));
    limits.max_connections = limits.max_connections.max(1);
    limits.per_connection_requests = limits.per_connection_requests.max(1);
    // Plain text only when the config says so (issue 8); check before anything starts.
    let transport = config.transport()?;
    let (server_tls, agent_auth) = match &transport {
        Transport::Tls(files) => (
            Some(crate::edge::tls::server_config(files, limits.tls_handshake)?),
            AgentAuth::Certificate,
        ),
        Transport::InsecurePlaintext => (None, AgentAuth::Insecure),
    };
    let auth = if config.operators.is_empty() {
        crate::edge::auth::Authenticator::open()
    } else {
        crate::edge::auth::Authenticator::new(config.operators.clone())
    };
    let security = SecurityView {
        transport: if server_tls.is_some() {
            TransportView::MutualTls
        } else {
            TransportView::InsecurePlaintext
        },
        operator_auth: if auth.is_open() {
            OperatorAuth::None
        } else {
            OperatorAuth::Tokens
        },
        warning: server_tls.is_none().then(|| {
            format!(
                "{}{}",
                pdwarden_security::tls::PLAINTEXT_WARNING,
                if auth.is_open() {
                    "; the operator API accepts anyone"
                } else {
                    ""
                }
            )
        }),
    };
    if let Some(w) = &security.warning {
        tracing::warn!("{w}");
    }
    let holder = format!(
        "pid {}, listening on {}",
        std::process::id(),
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| config.listen.to_string())
    );
    let opened = open_journal(&config, &holder)?;
    let fleet = Fleet::with_leadership(opened.leadership.clone());
    let resign = opened.resign;
    let resigned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ctx = OperationContext {
        agents: Arc::new(fleet.clone()),
        journal: opened.journal,
    };
    // Every conclusion from here on feeds the operations' series, the
    // resumed operations' included.
    let board = WatchBoard::with_leadership(opened.leadership.clone());
    ctx.journal.observe_conclusions(board.operations.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(addr) = config.readiness_listen {
        let ready = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Readiness { addr, source })?;
        tracing::info!(%addr, "readiness endpoint listening");
        tokio::spawn(crate::edge::ready::serve(ready, board.clone(), stop_rx.clone()));
    }
    // The leader's work: take over what an earlier leader (or this process
    // before a restart) left running, retry refused conclusions, watch the
    // pairs. A sole orchestrator does it now; an elected one once it leads.
    let leader_tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
    let deposed: Task<String> = match opened.election {
        None => {
            let taken = take_over(&ctx, &config, &board, stop_rx.clone())?;
            leader_tasks.lock().unwrap_or_else(|p| p.into_inner()).extend(taken);
            Box::pin(std::future::pending())
        }
        Some(election) => {
            let (ctx, config, board, stop_rx) = (ctx.clone(), config.clone(), board.clone(), stop_rx.clone());
            let (tasks, fleet) = (leader_tasks.clone(), fleet.clone());
            let mut role = fleet.leadership.subscribe();
            Box::pin(async move {
                let mut election = tokio::spawn(election);
                // Leads once the election says so, then takes over.
                let leading = async {
                    loop {
                        if fleet.leadership.leads() {
                            return;
                        }
                        if role.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    }
                };
                tokio::select! {
                    () = leading => {}
                    why = election_ended(&mut election) => return why,
                }
                match take_over(&ctx, &config, &board, stop_rx) {
                    Ok(t) => tasks.lock().unwrap_or_else(|p| p.into_inner()).extend(t),
                    Err(e) => return format!("could not read the journal to take over ({e})"),
                }
                election_ended(&mut election).await
            })
        }
    };
    let control = ControlService {
        redactor: pdwarden_security::redact::Redactor::new(&config.redact_env),
        config: Arc::new(config),
        ctx,
        fleet: fleet.clone(),
        watch: board,
        security,
    };
    // Stopped with the leader's tasks (it publishes only while leading).
    if matches!(control.config.journal, crate::config::JournalSpec::Etcd(_)) {
        leader_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(spawn_status_publisher(control.clone()));
        leader_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(spawn_follower_mirror(control.clone()));
    }
    // HTTP/2 pings both ways (the agent pings too): a partition gives no
    // FIN, and without them an agent cut off mid-operation would look
    // attached until TCP gave up, minutes later. With them the agent's
    // stream ends within ~15 s, its waiting operation fails with "agent
    // disconnected", and `status` says so. The connections themselves are
    // capped and closed when silent (`Incoming`), and a TLS handshake is
    // dropped after `tls_handshake` (issue 32).
    let per_connection = u32::try_from(limits.per_connection_requests).unwrap_or(u32::MAX);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout))
        .max_concurrent_streams(Some(per_connection))
        .concurrency_limit_per_connection(limits.per_connection_requests);
    if let Some(tls) = server_tls {
        builder = builder.tls_config(tls)?;
    }
    // Everything is loaded (TLS files, the journal, its ownership): only now
    // say so (issue 16, finding 10).
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, max_connections = limits.max_connections, "orchestrator listening"),
        Err(e) => tracing::info!(error = %e, max_connections = limits.max_connections, "orchestrator listening"),
    }
    let watchdog = crate::edge::service_manager::ready_and_watch(control.ctx.journal.clone());
    // Graceful shutdown waits for every stream to end, and an attached
    // agent's never does on its own (issue 16, finding 8: still alive a
    // minute after SIGTERM, its ports bound). Give the streams
    // SHUTDOWN_GRACE after the signal, then return and drop them: agents
    // reconnect with backoff to whichever orchestrator comes next.
    let (fired_tx, fired_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = {
        let (fleet, resigned) = (fleet.clone(), resigned.clone());
        async move {
            shutdown.await;
            // A leader on etcd hands over first: it stops acting, lets its
            // agents go to the followers, and gives its lease back, so the
            // next leader does not wait a lease for it.
            if let Some(resign) = resign {
                resigned.store(true, std::sync::atomic::Ordering::SeqCst);
                fleet.leadership.set(pdwarden_model::status::Role::Follower {
                    leader_url: None,
                    why: "resigned: this orchestrator is shutting down".into(),
                });
                let released = resign();
                fleet.release_agents();
                released.await;
                tracing::info!("resigned the leadership");
            }
            // Attached agents' streams end now (they reconnect with
            // backoff to whichever orchestrator comes next), so graceful
            // shutdown need not wait the grace for them (issue 32: SIGTERM
            // with an agent attached took 6.4 s, the grace and more).
            fleet.release_agents();
            let _ = fired_tx.send(());
        }
    };
    let fleet_for_release = fleet.clone();
    let served = builder
        .add_service(AgentLinkServer::new(AgentLinkService { fleet, agent_auth }))
        .add_service(crate::edge::auth::Authorized::new(ControlServer::new(control), auth))
        .serve_with_incoming_shutdown(Incoming::new(listener, &limits), shutdown);
    tokio::pin!(served);
    // Losing the leadership by resigning is the planned shutdown, not an error.
    let mut deposed: Task<String> = {
        let resigned = resigned.clone();
        Box::pin(async move {
            let why = deposed.await;
            if resigned.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            why
        })
    };
    let served = tokio::select! {
        r = &mut served => r,
        why = &mut deposed => {
            tracing::error!(%why, "lost the leadership: exiting");
            let _ = stop_tx.send(true);
            fleet_for_release.release_agents();
            for t in leader_tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                t.abort();
            }
            return Err(ServeError::Deposed(why));
        }
        () = async {
            if fired_rx.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "streams still open after the shutdown grace: closing them");
            Ok(())
        }
    };
    let _ = stop_tx.send(true);
    if let Some(w) = watchdog {
        w.abort();
    }
    for t in leader_tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
        t.abort();
    }
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pdwarden_proto::v1::{GatePairRequest, control_client::ControlClient};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A config with pair `p` on host `gpu-1`: `top` holds top-level keys,
    /// `tables` is appended.
    fn config(dir: &std::path::Path, top: &str, tables: &str) -> String {
        format!(
            r#"listen = "127.0.0.1:0"
journal = {journal:?}
{top}
[[pair]]
name = "p"
prefill = [{{ host = "gpu-1", unit = "prefill-0" }}]
decode = [{{ host = "gpu-1", unit = "decode-0" }}]
router = [{{ host = "gpu-1", unit = "router-0" }}]
[pair.probe]
model = "m"
prompt = "hi"
warm_budget_ms = 1000
cold_allowance_ms = 2000
probe_timeout_ms = 2000
[pair.watch]
enabled = false
{tables}"#,
            journal = dir.join("journal.sqlite"),
        )
    }

    fn plaintext(dir: &std::path::Path) -> String {
        config(dir, "insecure_plaintext = true", "")
    }

    /// The real server on loopback until the sender is dropped.
    async fn start(config: &str, limits: ConnectionLimits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = OrchestratorConfig::from_toml_str(config).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let served = serve_with_limits(listener, config, limits, async move {
                let _ = stopped.await;
            })
            .await;
            if let Err(e) = served {
                panic!("serve: {e}");
            }
        });
        (addr, stop)
    }

    async fn plain_client(addr: std::net::SocketAddr) -> ControlClient<tonic::transport::Channel> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match ControlClient::connect(format!("http://{addr}")).await {
                Ok(c) => return c,
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The refusal's code and its one line.
    fn refusal<T: std::fmt::Debug>(r: Result<T, Status>) -> (tonic::Code, String) {
        let s = r.unwrap_err();
        (s.code(), s.message().to_string())
    }

    /// Issue 32, small item: SIGTERM with an agent attached took 6.4 s
    /// against "within 5 s" — graceful shutdown waited the whole grace for
    /// the agent's stream, which never ends on its own. Now the agents are
    /// released at the signal: the stream ends and the server returns well
    /// within the grace.
    /// Issue 48, item 3: a read-only operator printed an evidence capture
    /// whole (argv, log tails, metrics, stacks). Now a reader lists the
    /// operations (and so sees that a capture exists, and its summary) but
    /// is refused the contents in one line naming the role needed;
    /// `forensics` and `operate` read them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_is_refused_a_captures_contents() {
        let dir = tempfile::tempdir().unwrap();
        {
            let j = Journal::open(&dir.path().join("journal.sqlite")).unwrap();
            j.begin("op-1", "co_restart", "p", None).unwrap();
            let capture = pdwarden_model::forensics::Capture {
                why: "automatic recovery".into(),
                units: vec![pdwarden_model::forensics::UnitCapture {
                    unit: "decode-0".into(),
                    log_tail: "the engine's log".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            j.append("op-1", 1, crate::ops::forensics::ENTRY, &capture).unwrap();
            j.conclude(
                "op-1",
                "healthy",
                &serde_json::json!({ "verdict": "healthy", "reasons": [] }),
            )
            .unwrap();
        }
        let tokens: Vec<(&str, String)> = ["read", "forensics", "operate"]
            .into_iter()
            .map(|r| (r, pdwarden_security::operators::new_token()))
            .collect();
        let operators: String = tokens
            .iter()
            .map(|(role, t)| {
                format!(
                    "[[operator]]\nname = \"{role}-op\"\nrole = \"{role}\"\ntoken_sha256 = \"{}\"\n",
                    pdwarden_security::operators::hash_token(t)
                )
            })
            .collect();
        let (addr, _stop) = start(
            &config(dir.path(), "insecure_plaintext = true", &operators),
            ConnectionLimits::default(),
        )
        .await;
        let mut c = plain_client(addr).await;
        let ask = |token: &str, evidence: &str| {
            let mut r = Request::new(HistoryRequest {
                pair: "p".into(),
                limit: 5,
                evidence: evidence.into(),
            });
            r.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            r
        };
        let (reader, forensics, operate) = (&tokens[0].1, &tokens[1].1, &tokens[2].1);
        let list = c.history(ask(reader, "")).await.unwrap().into_inner().json;
        assert!(list.contains("op-1"), "{list}");
        let (code, line) = refusal(c.history(ask(reader, "op-1")).await);
        assert_eq!(code, tonic::Code::PermissionDenied, "{line}");
        assert_eq!(
            line,
            "operator read-op has role read; an evidence capture's contents (history --evidence) need role forensics or operate"
        );
        // Refused whatever the operation: nothing is said about it.
        let (code, _) = refusal(c.history(ask(reader, "no-such-op")).await);
        assert_eq!(code, tonic::Code::PermissionDenied);
        for token in [forensics, operate] {
            let json = c.history(ask(token, "op-1")).await.unwrap().into_inner().json;
            assert!(json.contains("the engine's log"), "{json}");
        }
        let (code, line) = refusal(c.restart_pair(ask_restart(forensics)).await);
        assert_eq!(code, tonic::Code::PermissionDenied, "{line}");
    }

    fn ask_restart(token: &str) -> Request<RestartPairRequest> {
        let mut r = Request::new(RestartPairRequest {
            pair: "p".into(),
            request_id: "r-1".into(),
            rolling: false,
            only_sick: false,
        });
        r.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        r
    }

    /// Issue 36: a follower's readiness answers with the leader's views as
    /// published; an unreadable publication is no view (not ready).
    #[test]
    fn a_followers_board_mirrors_the_published_views() {
        let view = serde_json::json!({
            "pair": "p", "state": "healthy", "ready": true, "reasons": [],
            "held": null, "auto_recover": true, "recoveries_in_window": 0,
            "max_recoveries": 3, "recovery_window_ms": 1, "probes_sent": 0,
            "probes_deferred": 0, "last_probe": null, "last_recovery": null, "units": [],
        });
        let published = serde_json::json!({ "fleet": {}, "watch": [view] }).to_string();
        let board = WatchBoard::default();
        board.mirror(published_watch(&published));
        assert_eq!(crate::edge::ready::route("/ready/pair/p", &board).0, 200);
        assert_eq!(crate::edge::ready::route("/ready", &board).0, 200);
        board.mirror(published_watch("not json"));
        assert_eq!(crate::edge::ready::route("/ready/pair/p", &board).0, 404);
        assert_eq!(crate::edge::ready::route("/ready", &board).0, 503);
    }

    /// Issue 48, item 6: a published view stamped in the future has a
    /// negative age, and counted as fresh for as long as the stamp lasted.
    /// Stale now, however far ahead; a view of the present or the fresh
    /// past is still used, one past the bound is not.
    #[test]
    fn a_published_view_stamped_in_the_future_is_stale() {
        for age_ms in [-1, -5_000, -PUBLISHED_STATUS_FRESH_MS, i64::MIN] {
            assert!(!published_is_fresh(age_ms), "{age_ms} ms");
        }
        assert!(published_is_fresh(0));
        assert!(published_is_fresh(PUBLISHED_STATUS_FRESH_MS));
        assert!(!published_is_fresh(PUBLISHED_STATUS_FRESH_MS + 1));
    }

    /// Issue 35: an operator's co-restart captures first only when the
    /// watch judged the pair wedged, suspect or held, and says why.
    #[test]
    fn an_operator_restart_captures_only_a_pair_the_watch_judged_wedged() {
        let view = |state: &str| -> PairWatchView {
            serde_json::from_value(serde_json::json!({
                "pair": "p", "state": state, "ready": false,
                "reasons": ["decode-0: no progress for 9.5 s; health answers 200"],
                "held": null, "auto_recover": true, "recoveries_in_window": 0,
                "max_recoveries": 3, "recovery_window_ms": 1, "probes_sent": 0,
                "probes_deferred": 0, "last_probe": null, "last_recovery": null, "units": [],
            }))
            .unwrap()
        };
        for state in ["wedged", "suspect", "held"] {
            let (entry, payload) = capture_opening(Some(&view(state))).expect(state);
            assert_eq!(entry, crate::ops::forensics::OPENING);
            let why = payload["why"].as_str().unwrap();
            assert!(why.contains(state) && why.contains("no progress for 9.5 s"), "{why}");
        }
        for state in [
            "healthy",
            "unproven",
            "down",
            "recovering",
            "operation_running",
            "starting",
        ] {
            assert!(capture_opening(Some(&view(state))).is_none(), "{state}");
        }
        assert!(capture_opening(None).is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_with_an_agent_attached_does_not_wait_the_grace() {
        use pdwarden_proto::v1::agent_link_client::AgentLinkClient;
        use pdwarden_proto::v1::{AgentMessage, Register, agent_message};
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = OrchestratorConfig::from_toml_str(&plaintext(dir.path())).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_with_limits(
            listener,
            config,
            ConnectionLimits::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let channel = loop {
            match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
            {
                Ok(c) => break c,
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.send(AgentMessage {
            kind: Some(agent_message::Kind::Register(Register {
                host: "gpu-1".into(),
                agent_instance_id: "i-1".into(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut inbound = AgentLinkClient::new(channel)
            .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        // Attached: the orchestrator's first message (its ack) arrives.
        inbound.message().await.unwrap().expect("the registration's answer");
        let signalled = tokio::time::Instant::now();
        stop.send(()).unwrap();
        let ended = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
        assert!(ended.is_ok(), "the agent's stream still open after the grace");
        // As the agent does: its session over, its side of the stream goes.
        drop(tx);
        tokio::time::timeout(SHUTDOWN_GRACE, served)
            .await
            .expect("serve returned")
            .unwrap()
            .unwrap();
        assert!(
            signalled.elapsed() < SHUTDOWN_GRACE / 2,
            "{:?} from the signal to the end",
            signalled.elapsed()
        );
    }

    /// Issue 32, finding 1: the server took any `request_id` and any name
    /// (the CLI checked, the server did not): 1 MB ids broke `history`,
    /// and a 100 KB pair name came back as "h2 protocol error" (the name
    /// quoted whole in the error's header). Each is one line naming the
    /// field, before anything else is looked at.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_field_is_bounded_in_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, _stop) = start(&plaintext(dir.path()), ConnectionLimits::default()).await;
        let mut c = plain_client(addr).await;
        let mb = "r".repeat(1 << 20);
        let big_pair = "p".repeat(100 * 1024);
        let ids = "expected 1 to 128 printable ASCII characters without spaces";
        let names = "expected 1 to 128 letters, digits, '.', '_' and '-'";
        let check = |(code, line): (tonic::Code, String), says: &str| {
            assert_eq!(code, tonic::Code::InvalidArgument, "{line}");
            assert!(line.starts_with(says), "{line:?} should start with {says:?}");
            assert!(line.len() < 300 && !line.contains('\n'), "{line}");
        };
        let restart = |pair: &str, request_id: &str| RestartPairRequest {
            pair: pair.into(),
            request_id: request_id.into(),
            rolling: false,
            only_sick: false,
        };
        check(
            refusal(c.restart_pair(restart("p", &mb)).await),
            &format!("request_id: 1048576 bytes: {ids}"),
        );
        check(
            refusal(c.restart_pair(restart("p", "a\u{1}b")).await),
            "request_id: \"a\\u{1}b\" has '\\u{1}' at byte 1",
        );
        check(
            refusal(c.restart_pair(restart("p", "has space")).await),
            "request_id: \"has space\" has ' ' at byte 3",
        );
        check(
            refusal(c.restart_pair(restart(&big_pair, "id-1")).await),
            &format!("pair: 102400 bytes: {names}"),
        );
        check(
            refusal(c.restart_pair(restart("p#gate", "id-1")).await),
            "pair: \"p#gate\" has '#' at byte 1",
        );
        check(
            refusal(
                c.verify_pair(VerifyPairRequest {
                    pair: "p".into(),
                    request_id: mb.clone(),
                    include_abort_storm: false,
                    ..Default::default()
                })
                .await,
            ),
            "request_id: 1048576 bytes",
        );
        check(
            refusal(
                c.history(HistoryRequest {
                    pair: big_pair.clone(),
                    limit: 5,
                    ..Default::default()
                })
                .await,
            ),
            "pair: 102400 bytes",
        );
        check(
            refusal(
                c.history(HistoryRequest {
                    pair: "../../etc".into(),
                    limit: 5,
                    ..Default::default()
                })
                .await,
            ),
            "pair: \"../../etc\" has '/'",
        );
        check(
            refusal(
                c.restart_unit(RestartUnitRequest {
                    host: "gpu 1".into(),
                    unit: "decode-0".into(),
                    request_id: "id-2".into(),
                })
                .await,
            ),
            "host: \"gpu 1\" has ' '",
        );
        check(
            refusal(
                c.restart_unit(RestartUnitRequest {
                    host: String::new(),
                    unit: big_pair.clone(),
                    request_id: "id-2".into(),
                })
                .await,
            ),
            "unit: 102400 bytes",
        );
        check(
            refusal(
                c.restart_unit(RestartUnitRequest {
                    host: String::new(),
                    unit: "decode-0".into(),
                    request_id: mb.clone(),
                })
                .await,
            ),
            "request_id: 1048576 bytes",
        );
        check(
            refusal(
                c.status(StatusRequest {
                    hosts: vec!["gpu-1".into(), "a\0b".into()],
                    ..Default::default()
                })
                .await,
            ),
            "hosts: \"a\\0b\" has '\\0'",
        );
        check(
            refusal(
                c.gate_pair(GatePairRequest {
                    pair: "p".into(),
                    request_id: mb.clone(),
                    set_env: [("K".to_string(), "1".to_string())].into(),
                    ..Default::default()
                })
                .await,
            ),
            "request_id: 1048576 bytes",
        );
        // Still answered as before: an empty request id is "none", a
        // well-formed unknown pair is not found, the known one reaches the
        // preflight (no agent attached here).
        let (code, line) = refusal(c.restart_pair(restart("nope", "")).await);
        assert_eq!(code, tonic::Code::NotFound, "{line}");
        let (code, line) = refusal(c.restart_pair(restart("p", "")).await);
        assert_eq!(code, tonic::Code::Unavailable, "{line}");
        c.history(HistoryRequest {
            pair: "p".into(),
            limit: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    }

    /// Issue 32, finding 3: a gate's arguments (a NUL in a key, one key
    /// both set and unset) were refused only after the whole baseline was
    /// measured. The server checks them as the request arrives: before the
    /// preflight (no agent is attached here, so anything later would say
    /// so instead).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gate_arguments_are_refused_as_the_request_arrives() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, _stop) = start(&plaintext(dir.path()), ConnectionLimits::default()).await;
        let mut c = plain_client(addr).await;
        let gate = |set_env: &[(&str, &str)], unset_env: &[&str], units: &[&str]| GatePairRequest {
            pair: "p".into(),
            request_id: "g-1".into(),
            set_env: set_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            unset_env: unset_env.iter().map(|k| k.to_string()).collect(),
            set_args: Default::default(),
            units: units.iter().map(|u| u.to_string()).collect(),
        };
        for (req, says) in [
            (
                gate(&[("K\0EY", "1")], &[], &[]),
                "--set-env \"K\\0EY\": the variable name contains a NUL byte",
            ),
            (
                gate(&[("K", "1\0 2")], &[], &[]),
                "--set-env \"K\": the value contains a NUL byte",
            ),
            (
                gate(&[("K", "1")], &["K"], &[]),
                "--unset-env \"K\": also given to --set-env",
            ),
            (gate(&[("K", "1")], &[], &["a/b"]), "--unit: \"a/b\" has '/'"),
            (gate(&[], &[], &[]), "nothing to change"),
        ] {
            let (code, line) = refusal(c.gate_pair(req).await);
            assert_eq!(code, tonic::Code::InvalidArgument, "{line}");
            assert!(line.starts_with(says), "{line:?} should start with {says:?}");
        }
        // A valid change goes on to the preflight.
        let (code, line) = refusal(c.gate_pair(gate(&[("K", "1")], &[], &[])).await);
        assert_eq!(code, tonic::Code::Unavailable, "{line}");
    }

    /// Whether the server closed `conn` within `within` (EOF or an error);
    /// what it sent first (its HTTP/2 settings) is read past.
    async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1024];
        tokio::time::timeout(within, async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    async fn silent_connections(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(TcpStream::connect(addr).await.unwrap());
        }
        out
    }

    fn short(idle: Duration, max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            tls_handshake: Duration::from_millis(500),
            idle,
            http2_keepalive_interval: Duration::from_millis(200),
            http2_keepalive_timeout: Duration::from_millis(300),
            max_connections,
            ..ConnectionLimits::default()
        }
    }

    /// Issue 32, finding 4: idle TCP connections were never timed out (260
    /// of them under a 256-descriptor limit made `pdwarden status` fail).
    /// Connections that never speak are closed after the idle timeout; a
    /// real request meanwhile succeeds, and a real client's connection,
    /// idle for longer than that, stays open (the HTTP/2 pings read from it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_connections_are_closed_after_the_idle_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let idle = Duration::from_millis(1_000);
        let (addr, _stop) = start(&plaintext(dir.path()), short(idle, 64)).await;
        let mut c = plain_client(addr).await;
        let opened = tokio::time::Instant::now();
        let mut silent = silent_connections(addr, 20).await;
        c.status(StatusRequest::default()).await.unwrap();
        for conn in &mut silent {
            assert!(
                closed_within(conn, idle * 10).await,
                "a silent connection is still open {:?} after it was opened",
                opened.elapsed()
            );
        }
        assert!(
            opened.elapsed() >= idle,
            "closed before the idle timeout: {:?}",
            opened.elapsed()
        );
        // The real client's connection, idle for twice the timeout, still serves.
        tokio::time::sleep(idle * 2).await;
        c.status(StatusRequest::default()).await.unwrap();
    }

    /// The connection cap: past it a connection is closed as it is
    /// accepted (not left to hold a descriptor); once connections close,
    /// requests are served again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_past_the_cap_are_closed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, _stop) = start(&plaintext(dir.path()), short(Duration::from_secs(60), 4)).await;
        // The server is up (this client's connection closes with it).
        plain_client(addr).await.status(StatusRequest::default()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut held = silent_connections(addr, 4).await;
        for conn in &mut held {
            assert!(
                !closed_within(conn, Duration::from_millis(200)).await,
                "under the cap: held"
            );
        }
        let mut over = silent_connections(addr, 3).await;
        for conn in &mut over {
            assert!(
                closed_within(conn, Duration::from_secs(5)).await,
                "over the cap: closed"
            );
        }
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        plain_client(addr).await.status(StatusRequest::default()).await.unwrap();
    }

    /// Half-finished TLS handshakes (a connection that never speaks, one
    /// that sent part of a ClientHello) are dropped after the handshake
    /// timeout; a real client meanwhile connects and is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unfinished_tls_handshakes_are_dropped_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let certs = pdwarden_security::certs::CertDir(dir.path().join("pki"));
        certs.init(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let token = pdwarden_security::operators::new_token();
        let files = certs.orchestrator();
        let tables = format!(
            "[[operator]]\nname = \"rita\"\nrole = \"read\"\ntoken_sha256 = \"{}\"\n[tls]\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
            pdwarden_security::operators::hash_token(&token),
            files.ca,
            files.cert,
            files.key
        );
        // The idle timeout is long: only the handshake's closes these.
        let (addr, _stop) = start(&config(dir.path(), "", &tables), short(Duration::from_secs(60), 64)).await;
        let opened = tokio::time::Instant::now();
        let mut silent = silent_connections(addr, 10).await;
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(&[0x16, 0x03, 0x01, 0x01, 0x00, 0x01]).await.unwrap();
        let connection = pdwarden_client::Connection::new(
            format!("https://127.0.0.1:{}", addr.port()),
            pdwarden_client::Credentials {
                ca: Some(files.ca.clone()),
                token: Some(token),
                ..Default::default()
            },
        );
        let mut c = connection.connect().await.unwrap();
        c.status(StatusRequest::default()).await.unwrap();
        for conn in silent.iter_mut().chain([&mut partial]) {
            assert!(
                closed_within(conn, Duration::from_secs(10)).await,
                "an unfinished handshake is still open {:?} after it began",
                opened.elapsed()
            );
        }
        assert!(opened.elapsed() >= Duration::from_millis(500));
    }
}
