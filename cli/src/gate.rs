//! `pdwarden gate NAME --set-env KEY=VALUE …`: a knob flip as a measured,
//! reversible operation (the orchestrator's `gate` module does the work;
//! this prints its progress and its report).

use std::process::ExitCode;

use clap::Args;
use pdwarden_model::gate::config::ChangeArgs;
use pdwarden_model::gate::report::GateReport;
use pdwarden_proto::v1::GatePairRequest;

use crate::{Connection, CouldNotRun, could_not_run, print_json};

#[derive(Args)]
pub struct GateArgs {
    /// The pair.
    name: String,
    /// Set an environment variable on the changed units (repeatable).
    #[arg(long = "set-env", value_name = "KEY=VALUE")]
    set_env: Vec<String>,
    /// Remove an environment variable from the changed units (repeatable).
    #[arg(long = "unset-env", value_name = "KEY")]
    unset_env: Vec<String>,
    /// Set a command-line flag: `--set-arg --flag=value` replaces the value
    /// after an existing `--flag`, or appends it (repeatable).
    #[arg(long = "set-arg", value_name = "FLAG=VALUE", allow_hyphen_values = true)]
    set_arg: Vec<String>,
    /// Change only this unit (repeatable); default: the pair's engines.
    #[arg(long = "unit")]
    units: Vec<String>,
    #[arg(long)]
    json: bool,
    /// Idempotency key: a retry with a key already used starts nothing and
    /// names the gate it started (default: a fresh one).
    #[arg(long, value_name = "ID", value_parser = crate::request_id_arg)]
    request_id: Option<String>,
}

fn split_kv(flag: &str, s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{flag} {s:?}: expected KEY=VALUE")),
    }
}

pub async fn run(conn: &Connection, args: GateArgs) -> ExitCode {
    let json = args.json;
    match follow(conn, args).await {
        Ok(report) => {
            if json {
                print_json(&report);
            } else {
                pdwarden_client::say_part!("{}", report.render());
            }
            if report.verdict.kept() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
        Err(CouldNotRun(r)) => could_not_run(&r, json),
    }
}

impl GateArgs {
    pub fn json(&self) -> bool {
        self.json
    }
}

/// The gate request `args` ask for, refused in one line naming the flag
/// before anything is sent (issue 32): the orchestrator's own check of a
/// change (`ChangeArgs::validate`), on the flags as given, so that a key
/// given twice is refused rather than one of them silently kept.
fn request(args: &GateArgs) -> Result<GatePairRequest, String> {
    crate::check_name("pair", &args.name)?;
    let set_env = args
        .set_env
        .iter()
        .map(|s| split_kv("--set-env", s))
        .collect::<Result<Vec<_>, _>>()?;
    let set_args = args
        .set_arg
        .iter()
        .map(|s| split_kv("--set-arg", s))
        .collect::<Result<Vec<_>, _>>()?;
    ChangeArgs {
        set_env: set_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        unset_env: args.unset_env.iter().map(String::as_str).collect(),
        set_args: set_args.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        units: args.units.iter().map(String::as_str).collect(),
    }
    .validate()
    .map_err(|e| e.to_string())?;
    Ok(GatePairRequest {
        pair: args.name.clone(),
        request_id: crate::request_id_or_new(args.request_id.clone()),
        set_env: set_env.into_iter().collect(),
        unset_env: args.unset_env.clone(),
        set_args: set_args.into_iter().collect(),
        units: args.units.clone(),
    })
}

async fn follow(conn: &Connection, args: GateArgs) -> Result<GateReport, CouldNotRun> {
    let request = request(&args).map_err(CouldNotRun)?;
    conn.follow_gate(request, |line| {
        if !args.json {
            pdwarden_client::say!("{line}");
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Gate {
        #[command(flatten)]
        gate: GateArgs,
    }

    fn request_of(args: &[&str]) -> Result<GatePairRequest, String> {
        let parsed = Gate::try_parse_from(std::iter::once("gate").chain(args.iter().copied())).unwrap();
        request(&parsed.gate)
    }

    /// Issue 32, finding 3: the gate's arguments are checked before
    /// anything is sent (the orchestrator checks them again as the request
    /// arrives), in one line naming the flag.
    #[test]
    fn gate_arguments_are_checked_before_sending() {
        let r = request_of(&[
            "demo",
            "--set-env",
            "A=1",
            "--unset-env",
            "B",
            "--set-arg",
            "--x=2",
            "--unit",
            "decode-0",
            "--request-id",
            "id-1",
        ])
        .unwrap();
        assert_eq!(
            (
                r.set_env["A"].as_str(),
                r.unset_env,
                r.set_args["--x"].as_str(),
                r.units,
                r.request_id
            ),
            (
                "1",
                vec!["B".to_string()],
                "2",
                vec!["decode-0".to_string()],
                "id-1".to_string()
            )
        );
        for (args, says) in [
            (
                &["demo", "--set-env", "A=1", "--unset-env", "A"][..],
                "--unset-env \"A\": also given to --set-env",
            ),
            (
                &["demo", "--set-env", "A=1", "--set-env", "A=2"],
                "--set-env \"A\": given twice",
            ),
            (&["demo"], "nothing to change"),
            (&["demo", "--set-env", "=1"], "--set-env \"=1\": expected KEY=VALUE"),
            (
                &["demo#gate", "--set-env", "A=1"],
                "pair: \"demo#gate\" has '#' at byte 4",
            ),
            (
                &["demo", "--set-env", "A=1", "--unit", "a/b"],
                "--unit: \"a/b\" has '/'",
            ),
            (
                &["demo", "--set-arg", "x=1"],
                "--set-arg \"x\": the flag must start with '-'",
            ),
        ] {
            let e = request_of(args).unwrap_err();
            assert!(e.starts_with(says), "{args:?}: {e:?} should start with {says:?}");
        }
    }
}
