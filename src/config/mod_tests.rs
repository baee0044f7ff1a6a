//! Unit tests of `config/mod.rs` (moved out so that the module fits in a head).

use std::path::PathBuf;

use super::testkit::*;
use super::*;
use crate::cli::{parse_from, Invocation};

#[test]
fn numeric_flag_ranges() {
    let cases: &[(&[&str], &str)] = &[
            (&["--max-restarts", "-1", "t.py"], "--max-restarts '-1': must be >= 0"),
            (&["--monitor-interval", "0", "t.py"], "--monitor-interval '0': must be > 0"),
            (&["--monitor-interval", "nan", "t.py"], "--monitor-interval 'NaN': must be > 0"),
            (&["--node-rank", "-2", "t.py"], "--node-rank '-2': must be >= 0"),
            // A usage error wins over a missing script (issue 10: `--nproc-per-node 0 x`).
            (&["--nproc-per-node", "0", "missing.py"], "--nproc-per-node '0': must be > 0"),
            (&["--master-port", "70000", "t.py"], "--master-port '70000': must be between 0 and 65535"),
            (&["--shutdown-timeout", "-1", "t.py"], "--shutdown-timeout '-1': must be >= 0"),
            (
                &["--exit-barrier-timeout", "-5", "t.py"],
                "--exit-barrier-timeout '-5': must be a finite number of seconds >= 0",
            ),
            (
                &["--master-port", "29555", "--node-rank", "1", "t.py"],
                "--node-rank '1': must be less than the number of nodes (1)",
            ),
            (
                &["--rdzv-backend", "zookeeper", "t.py"],
                "--rdzv-backend 'zookeeper': unknown rendezvous backend (expected static, c10d, etcd-v3 or etcd)",
            ),
        ];
    for (argv, msg) in cases {
        let e = fail(argv);
        assert_eq!(e.to_string(), *msg, "{argv:?}");
        assert_eq!(e.exit_code(), crate::exit::USAGE, "{argv:?}");
    }
    let c = ok(&[
        "--max-restarts",
        "3",
        "--exit-barrier-timeout",
        "1.5",
        "t.py",
    ]);
    assert_eq!(c.max_restarts, 3);
    assert_eq!(c.exit_barrier_timeout, Duration::from_millis(1500));
    assert_eq!(ok(&["t.py"]).exit_barrier_timeout, Duration::from_secs(300));
}

#[test]
fn virtual_devices_checked_up_front() {
    // Checked up front for every local rank.
    let host = FakeHost::new();
    let env = [("CUDA_VISIBLE_DEVICES", "0,1")];
    let e = resolve_env(
        &["--virtual-local-rank", "--nproc-per-node", "4", "t.py"],
        &env,
        &host,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::VirtualDevices(crate::workerenv::VirtualDevicesError {
                local_rank: 2,
                ..
            })
        ),
        "{e}"
    );
    assert!(resolve_env(
        &["--virtual-local-rank", "--nproc-per-node", "2", "t.py"],
        &env,
        &host
    )
    .is_ok());
}

#[test]
fn pet_values_are_named_by_their_variable() {
    let resolve_pet = |argv: &[&str], env: &[(&str, &str)]| {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let lookup = env_of(env);
        let Ok(Invocation::Launch(a)) = parse_from(&argv, &lookup) else {
            panic!("parses");
        };
        resolve_with(*a, &lookup, &FakeHost::new())
    };
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (
            &["t.py"],
            &[("PET_NPROC_PER_NODE", "abc")],
            "PET_NPROC_PER_NODE='abc': expected a positive integer, cpu, gpu or auto",
        ),
        (
            &["t.py"],
            &[("PET_NPROC_PER_NODE", "gpu")],
            "PET_NPROC_PER_NODE gpu: no NVIDIA GPU found",
        ),
        (
            &["t.py"],
            &[("PET_RDZV_BACKEND", "zk")],
            "PET_RDZV_BACKEND='zk': unknown rendezvous backend",
        ),
        (
            &["t.py"],
            &[("PET_MAX_RESTARTS", "-1")],
            "PET_MAX_RESTARTS='-1': must be >= 0",
        ),
        // The command line wins, and is named as the flag.
        (
            &["--nproc-per-node", "x", "t.py"],
            &[("PET_NPROC_PER_NODE", "2")],
            "--nproc-per-node 'x': expected",
        ),
        // A PET value elsewhere does not relabel another flag's error.
        (
            &["--nnodes", "0", "t.py"],
            &[("PET_NPROC_PER_NODE", "2")],
            "--nnodes '0': ",
        ),
    ];
    for (argv, env, want) in cases {
        let e = resolve_pet(argv, env).unwrap_err();
        assert!(e.to_string().starts_with(want), "{argv:?} {env:?}: {e}");
    }
}

#[test]
fn full_resolution_keeps_every_field() {
    let c = ok(&[
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "2",
        "--role",
        "trainer",
        "--virtual-local-rank",
        "--report-json",
        "/tmp/r.json",
        "--shutdown-timeout",
        "4",
        "t.py",
        "x",
    ]);
    assert_eq!(c.nproc_per_node, 3);
    assert_eq!(c.nnodes, NodeRange { min: 1, max: 1 });
    assert_eq!(c.node_rank, 0);
    assert_eq!(c.max_restarts, 2);
    assert_eq!(c.role, "trainer");
    assert!(c.virtual_local_rank);
    assert_eq!(c.report_json, Some(PathBuf::from("/tmp/r.json")));
    assert_eq!(c.shutdown_timeout, Duration::from_secs(4));
    assert_eq!(c.command.args, vec!["-u", "t.py", "x"]);
    assert_eq!(c.local_addr, None);
}

/// The words the completion scripts offer (`cli`'s closed value sets) are exactly words
/// `config` accepts, and the hang flags' shown defaults are the ones [`hang::HangSettings`]
/// uses (issue 25: one default, stated once).
#[test]
fn completed_words_resolve_and_shown_defaults_hold() {
    for v in crate::cli::RDZV_BACKENDS {
        assert!(layout::parse_backend(v).is_ok(), "{v}");
    }
    for v in crate::cli::HANG_MODES {
        assert!(v.parse::<hang::HangMode>().is_ok(), "{v}");
    }
    for v in crate::cli::LEFTOVER_POLICIES {
        assert!(LeftoverPolicy::parse(v).is_some(), "{v}");
    }
    for v in crate::cli::CLUSTER_CHOICES {
        assert!(crate::cluster::ClusterChoice::parse(v).is_ok(), "{v}");
    }
    for v in crate::cli::EVENT_HANDLERS {
        assert!(observe::resolve(None, v, None, &|_| None).is_ok(), "{v}");
    }
    let d = hang::HangSettings::default();
    let shown = |name: &str| {
        crate::cli::flag_table()
            .into_iter()
            .find(|f| f.names[0] == name)
            .map(|f| f.default)
            .unwrap()
    };
    assert!(shown("--hang-detect").starts_with(&d.mode.to_string()));
    for (name, secs) in [
        ("--hang-timeout", d.steady_budget),
        ("--hang-startup-timeout", d.startup_budget),
        ("--hang-exit-skew-timeout", d.exit_skew_budget),
        ("--hang-poll-interval", d.poll_interval),
        ("--hang-capture-timeout", d.capture_timeout),
    ] {
        assert_eq!(shown(name), secs.as_secs().to_string(), "{name}");
    }
    assert_eq!(shown("--hang-cpu-idle"), format!("{}", d.cpu_idle_pct));
    assert_eq!(shown("--hang-io-idle"), d.io_idle_bytes.to_string());
}
