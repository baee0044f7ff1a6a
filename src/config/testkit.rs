//! Test support shared by the config tests: a fake machine and resolution shortcuts.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::*;
use crate::cli::{parse_from, Invocation};

pub(crate) struct FakeHost {
    pub cpus: usize,
    pub gpus: Option<usize>,
    pub nproc_limit: Option<u64>,
    pub files: HashMap<PathBuf, FileKind>,
}

impl FakeHost {
    pub(crate) fn new() -> Self {
        let mut files = HashMap::new();
        for (p, k) in [
            ("t.py", FileKind::File { executable: false }),
            ("/usr/bin/python3", FileKind::File { executable: true }),
            ("/bin/true", FileKind::File { executable: true }),
            ("/usr/bin/train", FileKind::File { executable: true }),
            ("./prog", FileKind::File { executable: true }),
            ("./data.txt", FileKind::File { executable: false }),
            ("localbin", FileKind::File { executable: true }),
            ("script", FileKind::File { executable: false }),
            ("/venv/bin/python", FileKind::File { executable: true }),
            ("/opt/py", FileKind::File { executable: true }),
            ("/logs/file", FileKind::File { executable: false }),
            ("/logs", FileKind::Dir),
        ] {
            files.insert(PathBuf::from(p), k);
        }
        FakeHost {
            cpus: 6,
            gpus: None,
            nproc_limit: None,
            files,
        }
    }
}

impl Host for FakeHost {
    fn cpu_count(&self) -> usize {
        self.cpus
    }
    fn nvidia_gpu_count(&self) -> Option<usize> {
        self.gpus
    }
    fn file(&self, path: &Path) -> FileKind {
        self.files.get(path).copied().unwrap_or(FileKind::Missing)
    }
    fn process_limit(&self) -> Option<u64> {
        self.nproc_limit
    }
    fn random_bytes(&self) -> [u8; 16] {
        [0xab; 16]
    }
}

pub(crate) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let mut map: HashMap<String, String> = HashMap::new();
    map.insert("PATH".into(), "/usr/bin:/bin".into());
    for (k, v) in pairs {
        map.insert(k.to_string(), v.to_string());
    }
    move |k: &str| map.get(k).cloned()
}

pub(crate) fn args(argv: &[&str]) -> LaunchArgs {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    match parse_from(&argv, &|_| None).expect("test argv parses") {
        Invocation::Launch(a) => *a,
        other => panic!("{other:?}"),
    }
}

pub(crate) fn resolve_env(
    argv: &[&str],
    env: &[(&str, &str)],
    host: &FakeHost,
) -> Result<LaunchConfig, ConfigError> {
    resolve_with(args(argv), &env_of(env), host)
}

pub(crate) fn ok(argv: &[&str]) -> LaunchConfig {
    resolve_env(argv, &[], &FakeHost::new()).expect("resolves")
}

pub(crate) fn fail(argv: &[&str]) -> ConfigError {
    resolve_env(argv, &[], &FakeHost::new()).expect_err("must fail")
}

/// A single-node `LaunchConfig` running `true`, for the supervisor's unit tests (store binding,
/// which launches use the rendezvous).
pub(crate) fn launch_config(
    standalone: bool,
    master_addr: &str,
    master_port: Option<u16>,
) -> LaunchConfig {
    LaunchConfig {
        nproc_per_node: 1,
        nnodes: NodeRange { min: 1, max: 1 },
        node_rank: 0,
        rdzv: RdzvConfig {
            backend: RdzvBackend::Static,
            endpoint: None,
            run_id: "t".into(),
            conf: Default::default(),
            settings: None,
        },
        standalone,
        master_addr: master_addr.into(),
        master_port,
        local_addr: None,
        max_restarts: 0,
        role: "default".into(),
        command: WorkerCommand {
            kind: EntrypointKind::Exec,
            program: "true".into(),
            args: Vec::new(),
            display_name: "true".into(),
            python: None,
        },
        log: LogConfig::default(),
        signals_to_handle: vec![libc::SIGTERM],
        shutdown_timeout: std::time::Duration::from_secs(1),
        virtual_local_rank: false,
        report_json: None,
        report_junit: None,
        exit_barrier_timeout: std::time::Duration::from_secs(300),
        leftovers: LeftoverPolicy::Kill,
        cluster: ClusterPlan::default(),
        hang: Default::default(),
        observe: Default::default(),
        binding: Default::default(),
        console: Default::default(),
        torch_env: Default::default(),
        run_env: Default::default(),
        resilience: Default::default(),
        warm: Default::default(),
        chaos: None,
    }
}

/// A `--rdzv-conf` map from pairs.
pub(crate) fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
