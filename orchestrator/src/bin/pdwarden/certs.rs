//! `pdwarden certs`: what an operator needs to turn security on (issue 8).
//!
//! `init` makes a private CA and the orchestrator's server certificate,
//! `agent HOST` one agent's client certificate (common name `agent:HOST`),
//! and `token NAME` a fresh operator token with the `[[operator]]` lines that
//! configure it. Only the token's SHA-256 goes into the config.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pdwarden_orchestrator::edge::auth::{hash_token, new_token};
use pdwarden_orchestrator::edge::certs::CertDir;

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
        /// `read` (status, history) or `operate` (everything).
        #[arg(long, default_value = "operate", value_parser = ["read", "operate"])]
        role: String,
    },
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
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
                println!("CA: {}", certs.ca().display());
                println!("orchestrator certificate for {}: {}", names.join(", "), f.cert.display());
                println!(
                    "\n# orchestrator.toml\n[tls]\nca = {}\ncert = {}\nkey = {}",
                    toml_str(&f.ca.display().to_string()),
                    toml_str(&f.cert.display().to_string()),
                    toml_str(&f.key.display().to_string())
                );
                println!(
                    "\nKeep {} offline if you can: whoever holds it can issue agent certificates.",
                    certs.ca_key().display()
                );
            })
        }
        .map_err(Into::into),
        CertsCmd::Agent { host, dir } => CertDir(dir)
            .issue_agent(&host)
            .map(|f| {
                println!(
                    "# agent.toml on {host} (orchestrator = \"https://...\")\nhost = {}\n[tls]\nca = {}\ncert = {}\nkey = {}",
                    toml_str(&host),
                    toml_str(&f.ca.display().to_string()),
                    toml_str(&f.cert.display().to_string()),
                    toml_str(&f.key.display().to_string())
                );
            })
            .map_err(Into::into),
        CertsCmd::Token { name, role } => {
            let token = new_token();
            println!("token (shown once; give it to {name} as PDWARDEN_TOKEN): {token}");
            println!(
                "\n# orchestrator.toml\n[[operator]]\nname = {}\nrole = \"{role}\"\ntoken_sha256 = \"{}\"",
                toml_str(&name),
                hash_token(&token)
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pdwarden certs: {e:#}");
            ExitCode::from(1)
        }
    }
}
