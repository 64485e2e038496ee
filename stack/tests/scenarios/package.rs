//! Issue 38: pdwarden installs as operators install things. The Debian
//! package (`scripts/package-deb.sh`) goes into a throw-away Debian root
//! (`scripts/setup-debroot.sh`: debootstrap minbase) with the real `dpkg
//! --root`, which runs its maintainer scripts chrooted there; every file it
//! installs or makes is checked for owner and mode, its units pass
//! `systemd-analyze verify` as installed, and nothing is started. The
//! container image the manifests name (`scripts/build-image.sh`, buildah)
//! runs `pdwarden --version` and `pdwarden-orchestrator --help` inside its
//! own root file system.
//!
//! `scripts/test.sh` makes the package, the root and the image before the
//! tests (nothing is built under them); each test holds the scenarios'
//! one-at-a-time lock, as a stack does. Both need root: where the image
//! cannot be built, `scripts/test.sh` leaves its test out by name and says
//! NOT RUN with the reason.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{bin, exclusive};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const BINARIES: [&str; 3] = ["pdwarden", "pdwarden-agent", "pdwarden-orchestrator"];
const UNITS: [&str; 2] = ["pdwarden-agent.service", "pdwarden-orchestrator.service"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// target/, where this build's binaries are (target/debug/…).
fn target() -> PathBuf {
    bin("pdwarden").parent().unwrap().parent().unwrap().to_path_buf()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn must_be_root(what: &str) {
    let uid = stdout(&run(Command::new("id").arg("-u")));
    assert_eq!(
        uid, "0",
        "{what} needs root (scripts/test.sh leaves it out, NOT RUN, elsewhere)"
    );
}

/// name → (uid, gid) and gid → name, read from a root's /etc/passwd and
/// /etc/group, so owners are the installed system's, not this host's.
struct Accounts {
    users: BTreeMap<u32, String>,
    groups: BTreeMap<u32, String>,
    passwd: BTreeMap<String, Vec<String>>,
}

impl Accounts {
    fn read(root: &Path) -> Accounts {
        let table = |file: &str| -> Vec<Vec<String>> {
            std::fs::read_to_string(root.join(file))
                .unwrap()
                .lines()
                .map(|l| l.split(':').map(str::to_string).collect())
                .collect()
        };
        let passwd: BTreeMap<String, Vec<String>> =
            table("etc/passwd").into_iter().map(|f| (f[0].clone(), f)).collect();
        Accounts {
            users: passwd.values().map(|f| (f[2].parse().unwrap(), f[0].clone())).collect(),
            groups: table("etc/group")
                .into_iter()
                .map(|f| (f[2].parse().unwrap(), f[0].clone()))
                .collect(),
            passwd,
        }
    }

    /// "MODE OWNER:GROUP" of `path` inside the root, e.g. "0700 pdwarden:pdwarden".
    fn describe(&self, root: &Path, path: &str) -> String {
        let m = std::fs::metadata(root.join(path.trim_start_matches('/')))
            .unwrap_or_else(|e| panic!("{path} not in the installed root: {e}"));
        let name = |t: &BTreeMap<u32, String>, id: u32| t.get(&id).cloned().unwrap_or_else(|| id.to_string());
        format!(
            "{:04o} {}:{}",
            m.mode() & 0o7777,
            name(&self.users, m.uid()),
            name(&self.groups, m.gid())
        )
    }
}

/// A copy of the debootstrapped root with logging stand-ins for every way a
/// maintainer script could start, enable or restart a daemon, and
/// /run/systemd/system present (so the scripts believe systemd runs).
struct ThrowAwayRoot {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl ThrowAwayRoot {
    fn new() -> ThrowAwayRoot {
        let base = target().join("debroot/bookworm");
        assert!(
            base.join(".pdwarden-debroot").is_file(),
            "no Debian root at {}: run scripts/setup-debroot.sh (scripts/test.sh does)",
            base.display()
        );
        let dir = tempfile::tempdir_in(target()).unwrap();
        let path = dir.path().join("root");
        run(Command::new("cp").arg("-a").arg(&base).arg(&path));
        std::fs::create_dir_all(path.join("run/systemd/system")).unwrap();
        for tool in [
            "usr/bin/systemctl",
            "usr/bin/deb-systemd-invoke",
            "usr/sbin/invoke-rc.d",
            "usr/sbin/service",
        ] {
            let name = tool.rsplit('/').next().unwrap();
            std::fs::write(
                path.join(tool),
                format!("#!/bin/sh\necho \"{name} $*\" >> /daemon-calls.log\n"),
            )
            .unwrap();
            std::fs::set_permissions(path.join(tool), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        ThrowAwayRoot { _dir: dir, path }
    }

    fn dpkg(&self, args: &[&str]) -> String {
        let out = run(Command::new("dpkg")
            .arg(format!("--root={}", self.path.display()))
            .args(args));
        format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr))
    }

    /// What the maintainer scripts asked of systemctl and friends.
    fn daemon_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path.join("daemon-calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn chroot(&self, args: &[&str]) -> String {
        stdout(&run(Command::new("chroot").arg(&self.path).args(args)))
    }
}

fn deb() -> PathBuf {
    let deb = target().join(format!("debian/pdwarden_{VERSION}-1_amd64.deb"));
    assert!(
        deb.is_file(),
        "no package at {}: run scripts/package-deb.sh (scripts/test.sh does)",
        deb.display()
    );
    deb
}

/// The package installs into a throw-away Debian root with every file,
/// owner and mode as below, makes the pdwarden system user and the
/// directories for configuration, secrets and state (secrets 0700, state
/// 0700, docs/operating.md "Files and secrets at rest"), installs no live
/// config, starts and enables nothing, and its units verify as installed.
/// Removing and purging it stop nothing and keep the journal and the keys.
#[test]
fn deb_installs_into_a_throwaway_root_with_owners_and_modes_and_starts_nothing() {
    // Copying a root, unpacking 150 MB and chrooting load both CPUs: not
    // beside a stack whose verdicts are timed (a real vLLM pair's greedy
    // reference request once went unanswered for 15 s beside this test).
    let _one = exclusive();
    must_be_root("dpkg --root (maintainer scripts run chrooted)");
    let deb = deb();
    let root = ThrowAwayRoot::new();
    let said = root.dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(said.contains("Setting up pdwarden"), "{said}");
    assert!(
        said.contains("nothing started"),
        "the postinst says what to do next: {said}"
    );

    // Every path the package owns: directories 0755 (or the system's own),
    // the binaries 0755, everything else 0644, all root's.
    let listed = root.dpkg(&["-L", "pdwarden"]);
    let owned: Vec<&str> = listed.lines().filter(|l| l.starts_with('/') && *l != "/.").collect();
    let accounts = Accounts::read(&root.path);
    let mut files = 0;
    for path in &owned {
        // Directories may be the system's links (merged /usr: /lib).
        let meta = std::fs::metadata(root.path.join(&path[1..])).unwrap();
        let want = if meta.is_dir() || path.starts_with("/usr/bin/") {
            "0755 root:root"
        } else {
            "0644 root:root"
        };
        if meta.is_file() {
            let link = std::fs::symlink_metadata(root.path.join(&path[1..])).unwrap();
            assert!(!link.file_type().is_symlink(), "{path} is a link");
        }
        assert_eq!(accounts.describe(&root.path, path), want, "{path}");
        files += usize::from(meta.is_file());
    }
    let must_own = [
        "/usr/bin/pdwarden".to_string(),
        "/usr/bin/pdwarden-agent".into(),
        "/usr/bin/pdwarden-orchestrator".into(),
        "/lib/systemd/system/pdwarden-agent.service".into(),
        "/lib/systemd/system/pdwarden-orchestrator.service".into(),
        "/usr/share/doc/pdwarden/examples/orchestrator.toml".into(),
        "/usr/share/doc/pdwarden/examples/agent-vllm-pd.toml".into(),
        "/usr/share/doc/pdwarden/examples/agent-sglang-pd.toml".into(),
        "/usr/share/doc/pdwarden/examples/ha/orchestrator-a.toml".into(),
        "/usr/share/doc/pdwarden/examples/ha/agent.toml".into(),
        "/usr/share/doc/pdwarden/copyright".into(),
        "/usr/share/doc/pdwarden/operating.md".into(),
        "/usr/share/bash-completion/completions/pdwarden".into(),
        "/usr/share/zsh/vendor-completions/_pdwarden".into(),
        "/usr/share/fish/vendor_completions.d/pdwarden.fish".into(),
        "/usr/share/man/man1/pdwarden.1.gz".into(),
        "/usr/share/man/man1/pdwarden-restart-pd-pair.1.gz".into(),
    ];
    for p in &must_own {
        assert!(owned.contains(&p.as_str()), "the package owns {p}: {owned:?}");
    }
    assert!(files >= must_own.len(), "{files} files");
    // Nothing under /etc is the package's: no config is installed live.
    assert!(owned.iter().all(|p| !p.starts_with("/etc")), "{owned:?}");
    for unit in UNITS {
        let installed = std::fs::read_to_string(root.path.join("lib/systemd/system").join(unit)).unwrap();
        let shipped = std::fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap();
        assert_eq!(installed, shipped, "{unit} is deploy/systemd's");
    }
    let bash = std::fs::read_to_string(root.path.join("usr/share/bash-completion/completions/pdwarden")).unwrap();
    assert!(bash.contains("complete -F _pdwarden"), "a bash completion for pdwarden");

    // The user and the directories the postinst made.
    let user = &accounts.passwd["pdwarden"];
    let uid: u32 = user[2].parse().unwrap();
    assert!(uid < 1000, "a system user: uid {uid}");
    assert_eq!(user[5], "/var/lib/pdwarden", "home");
    assert_eq!(user[6], "/usr/sbin/nologin", "no login shell");
    assert_eq!(accounts.groups[&user[3].parse::<u32>().unwrap()], "pdwarden");
    // Issue 48: the engines' own unprivileged user (the examples' `user`).
    let engine = &accounts.passwd["pdwarden-engine"];
    let engine_uid: u32 = engine[2].parse().unwrap();
    assert!(
        engine_uid < 1000 && engine_uid != uid,
        "a system user of its own: uid {engine_uid}"
    );
    assert_eq!(engine[5], "/var/lib/pdwarden-engine", "home");
    assert_eq!(engine[6], "/usr/sbin/nologin", "no login shell");
    assert_eq!(accounts.groups[&engine[3].parse::<u32>().unwrap()], "pdwarden-engine");
    for (path, want) in [
        ("/etc/pdwarden", "0750 root:pdwarden"),
        ("/etc/pdwarden/tls", "0700 pdwarden:pdwarden"),
        // Issue 48: the agent's key is the agent's (root's) alone, never
        // in the orchestrator's directory.
        ("/etc/pdwarden/agent-tls", "0700 root:root"),
        ("/var/lib/pdwarden", "0700 pdwarden:pdwarden"),
        ("/var/lib/pdwarden-agent", "0700 root:root"),
        ("/var/lib/pdwarden-engine", "0700 pdwarden-engine:pdwarden-engine"),
    ] {
        assert_eq!(accounts.describe(&root.path, path), want, "{path}");
    }
    let mut etc: Vec<_> = std::fs::read_dir(root.path.join("etc/pdwarden"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    etc.sort();
    assert_eq!(etc, ["agent-tls", "tls"], "no config installed live");

    // Nothing started, enabled or restarted: only the unit files were read.
    assert_eq!(root.daemon_calls(), ["systemctl daemon-reload"]);
    let wants = root.path.join("etc/systemd/system/multi-user.target.wants");
    for unit in UNITS {
        assert!(!wants.join(unit).exists(), "{unit} enabled");
    }

    // The binaries run in the installed system.
    assert_eq!(root.chroot(&["pdwarden", "--version"]), format!("pdwarden {VERSION}"));
    for b in &BINARIES[1..] {
        assert!(root.chroot(&[b, "--help"]).contains("--config"), "{b} --help");
    }

    // The units verify as installed: their ExecStart binaries resolved in
    // the installed root. The throw-away root has no systemd of its own, so
    // the host's unit library (the same systemd 252 as bookworm's) is laid
    // under it, never over the package's files.
    run(Command::new("cp")
        .arg("-an")
        .arg("/lib/systemd/system/.")
        .arg(root.path.join("lib/systemd/system")));
    for unit in UNITS {
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.path.display()))
            .arg(format!("/lib/systemd/system/{unit}"))
            .output()
            .expect("systemd-analyze not found: run scripts/setup-checks.sh");
        let said = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.trim().is_empty(), "{unit}: {said}");
    }
    let orch_unit =
        std::fs::read_to_string(root.path.join("lib/systemd/system/pdwarden-orchestrator.service")).unwrap();
    assert!(
        orch_unit.lines().any(|l| l == "User=pdwarden"),
        "the orchestrator runs as the package's user"
    );

    // An upgrade (the same package again) keeps an operator's own modes and
    // still starts nothing.
    std::fs::set_permissions(
        root.path.join("etc/pdwarden"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let said = root.dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(said.contains("Setting up pdwarden"), "{said}");
    assert_eq!(accounts.describe(&root.path, "/etc/pdwarden"), "0755 root:pdwarden");
    assert_eq!(
        root.daemon_calls(),
        ["systemctl daemon-reload", "systemctl daemon-reload"]
    );

    // Remove, then purge: nothing stopped, the binaries gone, the journal
    // and the keys kept, the empty directories gone.
    std::fs::write(root.path.join("var/lib/pdwarden/journal.sqlite"), b"journal").unwrap();
    std::fs::write(root.path.join("etc/pdwarden/tls/orchestrator-key.pem"), b"key").unwrap();
    root.dpkg(&["-r", "pdwarden"]);
    for b in BINARIES {
        assert!(!root.path.join("usr/bin").join(b).exists(), "{b} removed");
    }
    let said = root.dpkg(&["-P", "pdwarden"]);
    assert!(said.contains("kept /var/lib/pdwarden"), "{said}");
    assert!(
        root.path.join("var/lib/pdwarden/journal.sqlite").is_file(),
        "the journal survives a purge"
    );
    assert!(
        root.path.join("etc/pdwarden/tls/orchestrator-key.pem").is_file(),
        "the keys survive a purge"
    );
    for empty in [
        "var/lib/pdwarden-agent",
        "var/lib/pdwarden-engine",
        "etc/pdwarden/agent-tls",
    ] {
        assert!(!root.path.join(empty).exists(), "an empty directory goes: /{empty}");
    }
    assert!(
        root.daemon_calls().iter().all(|c| c == "systemctl daemon-reload"),
        "{:?}",
        root.daemon_calls()
    );
}

/// One image, with a working container from it removed at the end.
struct Container(String);

impl Container {
    fn of(image: &str) -> Container {
        Container(stdout(&run(Command::new("buildah").args([
            "from",
            "--pull-never",
            "--quiet",
            image,
        ]))))
    }

    fn run(&self, args: &[&str]) -> String {
        stdout(&run(Command::new("buildah")
            .args(["run", "--isolation", "chroot", &self.0, "--"])
            .args(args)))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("buildah").args(["rm", &self.0]).output();
    }
}

/// The image `deploy/kubernetes/orchestrator.yaml` runs was built here from
/// deploy/container/Containerfile (target/image/built, by
/// scripts/build-image.sh), and inside its root file system, as the image's
/// user (the manifests' uid 10001), `pdwarden --version` and
/// `pdwarden-orchestrator --help` run; the state directory is that user's.
#[test]
fn image_the_manifests_name_is_built_here_and_runs_version_and_help() {
    // Copying a root, unpacking 150 MB and chrooting load both CPUs: not
    // beside a stack whose verdicts are timed (a real vLLM pair's greedy
    // reference request once went unanswered for 15 s beside this test).
    let _one = exclusive();
    must_be_root("buildah");
    let image = format!("ghcr.io/pdwarden/pdwarden:{VERSION}");
    let built = std::fs::read_to_string(target().join("image/built"))
        .expect("no target/image/built: run scripts/build-image.sh (scripts/test.sh does)");
    let id = built
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{image} ")))
        .unwrap_or_else(|| panic!("{image} not in target/image/built: {built}"));
    let inspect = stdout(&run(
        Command::new("buildah").args(["inspect", "--type", "image", &image])
    ));
    let inspect: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(inspect["FromImageID"], id, "the image scripts/build-image.sh built");
    let config = &inspect["OCIv1"]["config"];
    assert_eq!(config["User"], "10001:10001");
    assert_eq!(config["Labels"]["org.opencontainers.image.version"], VERSION);

    let c = Container::of(&image);
    assert_eq!(c.run(&["pdwarden", "--version"]), format!("pdwarden {VERSION}"));
    let help = c.run(&["pdwarden-orchestrator", "--help"]);
    assert!(help.contains("--config"), "{help}");
    assert!(c.run(&["pdwarden-agent", "--help"]).contains("--config"));
    assert_eq!(c.run(&["id", "-un"]), "pdwarden");
    assert_eq!(c.run(&["id", "-u"]), "10001");
    assert_eq!(
        c.run(&["stat", "-c", "%a %U", "/var/lib/pdwarden", "/etc/pdwarden/tls"]),
        "700 pdwarden\n700 pdwarden"
    );
    // The image holds what the package installs, the units among them.
    assert_eq!(
        c.run(&["cat", "/lib/systemd/system/pdwarden-orchestrator.service"]),
        std::fs::read_to_string(repo().join("deploy/systemd/pdwarden-orchestrator.service"))
            .unwrap()
            .trim()
    );
}

/// The image `deploy/kubernetes/agent.yaml` runs on GPU nodes
/// (`scripts/build-image.sh --vllm`): the pdwarden image plus what the
/// agent of deploy/examples/agent-vllm-pd.toml starts, at the pinned
/// versions, run as root. `vllm serve` itself needs a GPU to start (on this
/// CPU-only host vLLM says "Failed to infer device type"), so the engine is
/// checked as installed, not served. ~10 GB: `scripts/test.sh` builds and
/// tests it only with PDWARDEN_VLLM_IMAGE=1 and otherwise says NOT RUN.
#[test]
fn vllm_image_holds_the_agent_the_engine_and_the_router() {
    // Copying a root, unpacking 150 MB and chrooting load both CPUs: not
    // beside a stack whose verdicts are timed (a real vLLM pair's greedy
    // reference request once went unanswered for 15 s beside this test).
    let _one = exclusive();
    must_be_root("buildah");
    let image = format!("ghcr.io/pdwarden/pdwarden-vllm:{VERSION}");
    let built = std::fs::read_to_string(target().join("image/built")).unwrap_or_default();
    assert!(
        built.lines().any(|l| l.starts_with(&format!("{image} "))),
        "{image} not built: run scripts/build-image.sh --vllm (scripts/test.sh does with PDWARDEN_VLLM_IMAGE=1)"
    );
    let file = std::fs::read_to_string(repo().join("deploy/container/Containerfile.vllm")).unwrap();
    let arg = |name: &str| {
        file.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .unwrap_or_else(|| panic!("ARG {name} in Containerfile.vllm"))
            .to_string()
    };
    let c = Container::of(&image);
    assert_eq!(c.run(&["id", "-u"]), "0", "the agent runs as root");
    assert_eq!(
        c.run(&["pdwarden-agent", "--version"]),
        format!("pdwarden-agent {VERSION}")
    );
    let versions = c.run(&[
        "python3",
        "-c",
        "import importlib.metadata as m; print(*(m.version(p) for p in ('vllm', 'vllm-router', 'nixl')))",
    ]);
    assert_eq!(
        versions,
        format!(
            "{} {} {}",
            arg("VLLM_VERSION"),
            arg("VLLM_ROUTER_VERSION"),
            arg("NIXL_VERSION")
        )
    );
    assert!(c.run(&["vllm-router", "--help"]).contains("--worker-urls"));
    for tool in ["vllm", "py-spy"] {
        assert_eq!(
            c.run(&["sh", "-c", &format!("command -v {tool}")]),
            format!("/opt/vllm/bin/{tool}")
        );
    }
}

/// The manifests and the units name only what the project builds: each
/// manifest's image is one scripts/build-image.sh makes, at the crate's
/// version, from a Containerfile here; each container's command and each
/// unit's ExecStart is a binary the package installs at that path.
#[test]
fn manifests_and_units_name_only_what_the_project_builds() {
    let script = std::fs::read_to_string(repo().join("scripts/build-image.sh")).unwrap();
    let builds = |name: &str, file: &str| {
        assert!(
            script.contains(&format!("\"{name}:$version\" deploy/container/{file}"))
                || (script.contains(&format!("image={name}:$version"))
                    && script.contains(&format!("\"$image\" deploy/container/{file}"))),
            "scripts/build-image.sh builds {name} from deploy/container/{file}"
        );
        assert!(repo().join("deploy/container").join(file).is_file(), "{file}");
    };
    builds("ghcr.io/pdwarden/pdwarden", "Containerfile");
    builds("ghcr.io/pdwarden/pdwarden-vllm", "Containerfile.vllm");
    let ours = [
        format!("ghcr.io/pdwarden/pdwarden:{VERSION}"),
        format!("ghcr.io/pdwarden/pdwarden-vllm:{VERSION}"),
    ];
    let vllm_file = std::fs::read_to_string(repo().join("deploy/container/Containerfile.vllm")).unwrap();
    assert!(
        vllm_file.contains(&format!("ARG BASE={}\n", ours[0])),
        "the vLLM image's default base"
    );

    let manifest = |name: &str| std::fs::read_to_string(repo().join("deploy/kubernetes").join(name)).unwrap();
    let mut images = 0;
    for file in ["orchestrator.yaml", "agent.yaml"] {
        for line in manifest(file).lines() {
            if let Some(image) = line.trim().strip_prefix("image:") {
                assert!(
                    ours.contains(&image.trim().to_string()),
                    "{file} names {image}, which nothing here builds"
                );
                images += 1;
            }
        }
    }
    assert_eq!(images, 2, "each workload names its image");
    assert!(manifest("orchestrator.yaml").contains("command: [\"pdwarden-orchestrator\""));
    assert!(manifest("agent.yaml").contains("pdwarden-agent --config"));

    let deb_meta = std::fs::read_to_string(repo().join("cli/Cargo.toml")).unwrap();
    for b in BINARIES {
        assert!(
            deb_meta.contains(&format!("[\"target/release/{b}\", \"usr/bin/\", \"755\"]")),
            "the package installs /usr/bin/{b}"
        );
    }
    for unit in UNITS {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(unit)).unwrap();
        let exec: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("ExecStart=")).collect();
        assert_eq!(exec.len(), 1, "{unit}");
        let program = exec[0].split_whitespace().next().unwrap();
        let b = program
            .strip_prefix("/usr/bin/")
            .unwrap_or_else(|| panic!("{unit} runs {program}"));
        assert!(BINARIES.contains(&b), "{unit} runs {program}");
        assert!(
            deb_meta.contains(&format!(
                "[\"../deploy/systemd/{unit}\", \"lib/systemd/system/\", \"644\"]"
            )),
            "the package installs {unit}"
        );
    }
}
