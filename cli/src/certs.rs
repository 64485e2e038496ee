//! `pdwarden certs`: what an operator needs to turn security on (issue 8).
//!
//! `init` makes a private CA and the orchestrator's server certificate,
//! `agent HOST` one agent's client certificate (common name `agent:HOST`),
//! and `token NAME` a fresh operator token with the `[[operator]]` lines that
//! configure it. Only the token's SHA-256 goes into the config.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pdwarden_security::certs::CertDir;
use pdwarden_security::operators::{OperatorConfig, OperatorRole, hash_token, new_token};
use pdwarden_security::tls::TlsFiles;
use serde::Serialize;

#[derive(Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    what: CertsCmd,
}

#[derive(Subcommand)]
enum CertsCmd {
    /// A new CA and the orchestrator's server certificate in DIR.
    Init {
        #[arg(long)]
        dir: PathBuf,
        /// A DNS name or IP address agents and the CLI use to reach the
        /// orchestrator (repeatable; default localhost and 127.0.0.1).
        #[arg(long = "name")]
        names: Vec<String>,
    },
    /// A client certificate for the agent of HOST, signed by DIR's CA.
    Agent {
        host: String,
        #[arg(long)]
        dir: PathBuf,
    },
    /// A new operator token: printed once, with the config lines holding its hash.
    Token {
        name: String,
        /// `read` (status, history), `forensics` (also evidence captures'
        /// contents: `history --evidence`) or `operate` (everything).
        #[arg(long, default_value = "operate", value_parser = ["read", "forensics", "operate"])]
        role: String,
    },
}

/// The config snippets printed for the operator to paste, written by the
/// configs' own serialisers.
#[derive(Serialize)]
struct TlsSnippet<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a str>,
    tls: &'a TlsFiles,
}

#[derive(Serialize)]
struct OperatorSnippet {
    operator: [OperatorConfig; 1],
}

fn snippet(value: &impl Serialize) -> String {
    toml::to_string(value).unwrap_or_else(|e| format!("# cannot be written as TOML: {e}"))
}

pub fn run(args: CertsArgs) -> ExitCode {
    let result: anyhow::Result<()> = match args.what {
        CertsCmd::Init { dir, mut names } => {
            if names.is_empty() {
                names = vec!["localhost".into(), "127.0.0.1".into()];
            }
            let certs = CertDir(dir);
            certs.init(&names).map(|()| {
                let f = certs.orchestrator();
                pdwarden_client::say!("CA: {}", certs.ca().display());
                pdwarden_client::say!(
                    "orchestrator certificate for {}: {}",
                    names.join(", "),
                    f.cert.display()
                );
                pdwarden_client::say!(
                    "\n# orchestrator.toml\n{}",
                    snippet(&TlsSnippet { host: None, tls: &f }).trim_end()
                );
                pdwarden_client::say!(
                    "\nKeep {} offline if you can: whoever holds it can issue agent certificates.",
                    certs.ca_key().display()
                );
            })
        }
        .map_err(Into::into),
        CertsCmd::Agent { host, dir } => CertDir(dir)
            .issue_agent(&host)
            .map(|f| {
                pdwarden_client::say!(
                    "# agent.toml on {host} (orchestrator = \"https://...\")\n{}",
                    snippet(&TlsSnippet {
                        host: Some(&host),
                        tls: &f
                    })
                    .trim_end()
                );
            })
            .map_err(Into::into),
        CertsCmd::Token { name, role } => {
            let token = new_token();
            pdwarden_client::say!("token (shown once; give it to {name} as PDWARDEN_TOKEN): {token}");
            let operator = OperatorConfig {
                name,
                role: OperatorRole::from_name(&role).unwrap_or(OperatorRole::Read),
                token_sha256: hash_token(&token),
            };
            pdwarden_client::say!(
                "\n# orchestrator.toml\n{}",
                snippet(&OperatorSnippet { operator: [operator] }).trim_end()
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            pdwarden_client::say_err!("pdwarden certs: {e:#}");
            ExitCode::from(1)
        }
    }
}
