//! Tests of the command-line parser (`cli.rs`) and its option table.

use super::*;
use std::collections::HashMap;

fn sv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn parse_env(args: &[&str], env: &[(&str, &str)]) -> Result<LaunchArgs, UsageError> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = move |k: &str| map.get(k).cloned();
    match parse_from(&sv(args), &get)? {
        Invocation::Launch(a) => Ok(*a),
        Invocation::Help | Invocation::Print(_) => panic!("unexpected help for {args:?}"),
    }
}

fn parse(args: &[&str]) -> Result<LaunchArgs, UsageError> {
    parse_env(args, &[])
}

fn err(args: &[&str]) -> String {
    parse(args).expect_err("must fail").to_string()
}

#[test]
fn defaults_match_torchrun() {
    let a = parse(&["t.py"]).unwrap();
    assert_eq!(a.nnodes, "1:1");
    assert_eq!(a.nproc_per_node, "1");
    assert_eq!(a.rdzv_backend, "static");
    assert_eq!(a.rdzv_endpoint, "");
    assert_eq!(a.rdzv_id, "none");
    assert_eq!(a.rdzv_conf, "");
    assert!(!a.standalone && !a.module && !a.no_python && !a.run_path);
    assert!(!a.virtual_local_rank);
    assert_eq!(a.max_restarts, 0);
    assert_eq!(a.monitor_interval, 0.1);
    assert_eq!(a.start_method, "spawn");
    assert_eq!(a.event_log_handler, "null");
    assert_eq!(a.role, "default");
    assert_eq!(a.log_dir, None);
    assert_eq!((a.redirects.as_str(), a.tee.as_str()), ("0", "0"));
    assert_eq!(a.log_line_prefix_template, "");
    assert_eq!(a.local_ranks_filter, "");
    assert!(a.duplicate_stdout_filters.is_empty() && a.duplicate_stderr_filters.is_empty());
    assert_eq!(a.node_rank, 0);
    assert_eq!(a.master_addr, "127.0.0.1");
    assert_eq!(a.master_port, None);
    assert_eq!(a.local_addr, None);
    assert_eq!(
        a.signals_to_handle,
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
    );
    assert_eq!(a.shutdown_timeout, None);
    assert_eq!(a.report_json, None);
    assert_eq!(a.exit_barrier_timeout, 300.0);
    assert_eq!(a.training_script, "t.py");
    assert!(a.training_script_args.is_empty());
}

/// Every value flag: (both spellings..., value, getter). Long because it is one table row per
/// flag, read as a list; the loop that checks them is the last dozen lines.
#[test]
fn every_value_flag_in_every_spelling_and_via_pet() {
    type Get = fn(&LaunchArgs) -> String;
    let table: &[(&[&str], &str, &str, Get)] = &[
        (&["--nnodes"], "2:4", "PET_NNODES", |a| a.nnodes.clone()),
        (
            &["--nproc-per-node", "--nproc_per_node"],
            "4",
            "PET_NPROC_PER_NODE",
            |a| a.nproc_per_node.clone(),
        ),
        (
            &["--rdzv-backend", "--rdzv_backend"],
            "c10d",
            "PET_RDZV_BACKEND",
            |a| a.rdzv_backend.clone(),
        ),
        (
            &["--rdzv-endpoint", "--rdzv_endpoint"],
            "h:1",
            "PET_RDZV_ENDPOINT",
            |a| a.rdzv_endpoint.clone(),
        ),
        (&["--rdzv-id", "--rdzv_id"], "job", "PET_RDZV_ID", |a| {
            a.rdzv_id.clone()
        }),
        (
            &["--rdzv-conf", "--rdzv_conf"],
            "a=1",
            "PET_RDZV_CONF",
            |a| a.rdzv_conf.clone(),
        ),
        (
            &["--max-restarts", "--max_restarts"],
            "3",
            "PET_MAX_RESTARTS",
            |a| a.max_restarts.to_string(),
        ),
        (
            &["--monitor-interval", "--monitor_interval"],
            "0.5",
            "PET_MONITOR_INTERVAL",
            |a| a.monitor_interval.to_string(),
        ),
        (
            &["--start-method", "--start_method"],
            "fork",
            "PET_START_METHOD",
            |a| a.start_method.clone(),
        ),
        (
            &["--event-log-handler", "--event_log_handler"],
            "console",
            "PET_EVENT_LOG_HANDLER",
            |a| a.event_log_handler.clone(),
        ),
        (&["--role"], "trainer", "PET_ROLE", |a| a.role.clone()),
        (&["--log-dir", "--log_dir"], "/tmp/l", "PET_LOG_DIR", |a| {
            a.log_dir.clone().unwrap()
        }),
        (&["-r", "--redirects"], "3", "PET_REDIRECTS", |a| {
            a.redirects.clone()
        }),
        (&["-t", "--tee"], "0:1,1:2", "PET_TEE", |a| a.tee.clone()),
        (
            &["--log-line-prefix-template", "--log_line_prefix_template"],
            "[${rank}]",
            "PET_LOG_LINE_PREFIX_TEMPLATE",
            |a| a.log_line_prefix_template.clone(),
        ),
        (
            &["--local-ranks-filter", "--local_ranks_filter"],
            "0,2",
            "PET_LOCAL_RANKS_FILTER",
            |a| a.local_ranks_filter.clone(),
        ),
        (
            &["--duplicate-stdout-filters", "--duplicate_stdout_filters"],
            "a,,b,c",
            "PET_DUPLICATE_STDOUT_FILTERS",
            |a| a.duplicate_stdout_filters.join("|"),
        ),
        (
            &["--duplicate-stderr-filters", "--duplicate_stderr_filters"],
            "x",
            "PET_DUPLICATE_STDERR_FILTERS",
            |a| a.duplicate_stderr_filters.join("|"),
        ),
        (&["--node-rank", "--node_rank"], "1", "PET_NODE_RANK", |a| {
            a.node_rank.to_string()
        }),
        (
            &["--master-addr", "--master_addr"],
            "10.0.0.1",
            "PET_MASTER_ADDR",
            |a| a.master_addr.clone(),
        ),
        (
            &["--master-port", "--master_port"],
            "29555",
            "PET_MASTER_PORT",
            |a| a.master_port.unwrap().to_string(),
        ),
        (
            &["--local-addr", "--local_addr"],
            "node1",
            "PET_LOCAL_ADDR",
            |a| a.local_addr.clone().unwrap(),
        ),
        (
            &["--signals-to-handle", "--signals_to_handle"],
            "SIGTERM",
            "PET_SIGNALS_TO_HANDLE",
            |a| a.signals_to_handle.clone(),
        ),
        (
            &["--shutdown-timeout", "--shutdown_timeout"],
            "7",
            "PET_SHUTDOWN_TIMEOUT",
            |a| a.shutdown_timeout.unwrap().to_string(),
        ),
        (
            &["--report-json", "--report_json"],
            "/tmp/r.json",
            "PET_REPORT_JSON",
            |a| a.report_json.clone().unwrap().display().to_string(),
        ),
        (
            &["--exit-barrier-timeout", "--exit_barrier_timeout"],
            "12.5",
            "PET_EXIT_BARRIER_TIMEOUT",
            |a| a.exit_barrier_timeout.to_string(),
        ),
    ];
    for (names, value, pet, get) in table {
        let expected = if *pet == "PET_DUPLICATE_STDOUT_FILTERS" {
            "a,b|c".to_string()
        } else {
            value.to_string()
        };
        for name in *names {
            let a = parse(&[name, value, "t.py"]).unwrap();
            assert_eq!(get(&a), expected, "{name} {value}");
            let joined = format!("{name}={value}");
            let a = parse(&[&joined, "t.py"]).unwrap();
            assert_eq!(get(&a), expected, "{joined}");
        }
        let a = parse_env(&["t.py"], &[(pet, value)]).unwrap();
        assert_eq!(get(&a), expected, "{pet}");
        // The command line wins over PET_*.
        let a = parse_env(&[names[0], value, "t.py"], &[(pet, "99")]).unwrap();
        assert_eq!(get(&a), expected, "{} over {pet}", names[0]);
    }
}

#[test]
fn every_boolean_flag_in_every_spelling_and_via_pet() {
    type Get = fn(&LaunchArgs) -> bool;
    let table: &[(&[&str], &str, Get)] = &[
        (&["--standalone"], "PET_STANDALONE", |a| a.standalone),
        (&["-m", "--module"], "PET_MODULE", |a| a.module),
        (&["--no-python", "--no_python"], "PET_NO_PYTHON", |a| {
            a.no_python
        }),
        (&["--run-path", "--run_path"], "PET_RUN_PATH", |a| {
            a.run_path
        }),
        (
            &["--virtual-local-rank", "--virtual_local_rank"],
            "PET_VIRTUAL_LOCAL_RANK",
            |a| a.virtual_local_rank,
        ),
    ];
    for (names, pet, get) in table {
        for name in *names {
            assert!(get(&parse(&[name, "t.py"]).unwrap()), "{name}");
            // PET_X=0 does not turn a command-line flag off (check_env).
            assert!(get(&parse_env(&[name, "t.py"], &[(pet, "0")]).unwrap()));
        }
        assert!(!get(&parse(&["t.py"]).unwrap()));
        for (text, on) in [("1", true), ("0", false), (" 2 ", true), ("-1", true)] {
            assert_eq!(
                get(&parse_env(&["t.py"], &[(pet, text)]).unwrap()),
                on,
                "{pet}={text}"
            );
        }
        if *pet == "PET_STANDALONE" {
            // As PyTorchJob sets it: empty means on (issue 25.1).
            assert!(get(&parse_env(&["t.py"], &[(pet, "")]).unwrap()), "{pet}=");
        } else {
            assert!(parse_env(&["t.py"], &[(pet, "")]).is_err(), "{pet}=");
        }
        let e = parse_env(&["t.py"], &[(pet, "true")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{pet}=\"true\": a boolean flag read from the environment must be an integer (0 = off, non-zero = on)")
        );
        let e = parse(&[&format!("{}=1", names[names.len() - 1]), "t.py"]).unwrap_err();
        assert!(
            e.to_string().contains("ignored explicit argument '1'"),
            "{e}"
        );
    }
}

#[test]
fn abbreviations_follow_argparse() {
    assert_eq!(
        parse(&["--nproc-per", "3", "t.py"]).unwrap().nproc_per_node,
        "3"
    );
    assert_eq!(
        parse(&["--nproc_per=3", "t.py"]).unwrap().nproc_per_node,
        "3"
    );
    assert_eq!(parse(&["--re", "3", "t.py"]).unwrap().redirects, "3");
    assert!(parse(&["--mod", "t.py"]).unwrap().module);
    assert_eq!(
        err(&["--nproc", "2", "t.py"]),
        "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
    );
    assert_eq!(
        err(&["--st", "t.py"]),
        "ambiguous option: --st could match --standalone, --start-method, --start_method"
    );
    // rdrun's own flags never take part in abbreviations.
    assert_eq!(
        err(&["--report", "x", "t.py"]),
        "unrecognized arguments: --report"
    );
    assert!(matches!(
        parse_from(&sv(&["--he"]), &|_| None),
        Ok(Invocation::Help)
    ));
}

#[test]
fn short_options() {
    assert_eq!(parse(&["-r3", "t.py"]).unwrap().redirects, "3");
    assert_eq!(parse(&["-r=3", "t.py"]).unwrap().redirects, "3");
    assert_eq!(parse(&["-t", "1", "t.py"]).unwrap().tee, "1");
    let a = parse(&["-mr3", "t.py"]).unwrap();
    assert!(a.module);
    assert_eq!(a.redirects, "3");
    assert_eq!(
        err(&["-mx", "t.py"]),
        "argument -m/--module: ignored explicit argument 'x'"
    );
    assert!(matches!(
        parse_from(&sv(&["-mh"]), &|_| None),
        Ok(Invocation::Help)
    ));
    assert!(matches!(
        parse_from(&sv(&["-h", "--bogus"]), &|_| None),
        Ok(Invocation::Help)
    ));
    assert!(matches!(
        parse_from(&sv(&["-hr3"]), &|_| None),
        Ok(Invocation::Help)
    ));
    assert_eq!(
        err(&["-m=", "t.py"]),
        "argument -m/--module: ignored explicit argument ''"
    );
    assert_eq!(
        err(&["--help=1"]),
        "argument -h/--help: ignored explicit argument '1'"
    );
    assert_eq!(
        err(&["-hx"]),
        "argument -h/--help: ignored explicit argument 'x'"
    );
}

#[test]
fn remainder_and_double_dash_rules() {
    let cases: &[(&[&str], &str, &[&str])] = &[
        (
            &["t.py", "--nproc-per-node", "5"],
            "t.py",
            &["--nproc-per-node", "5"],
        ),
        (&["--", "t.py", "a"], "t.py", &["a"]),
        (&["t.py", "--", "x"], "t.py", &["x"]),
        (&["t.py", "--", "--", "x"], "t.py", &["--", "x"]),
        (&["t.py", "a", "--", "b"], "t.py", &["a", "--", "b"]),
        (&["--", "--nnodes", "1", "t.py"], "--nnodes", &["1", "t.py"]),
        (&["--", "t.py", "--", "x"], "t.py", &["--", "x"]),
        (&["--nnodes", "2", "-", "x"], "-", &["x"]),
        (&["t.py", "-h"], "t.py", &["-h"]),
        // argparse would reject this ambiguous prefix even after the script; rdrun does not.
        (&["t.py", "--nproc", "2"], "t.py", &["--nproc", "2"]),
        (
            &["t.py", "${local_rank}", "$$x"],
            "t.py",
            &["${local_rank}", "$$x"],
        ),
    ];
    for (argv, script, rest) in cases {
        let a = parse(argv).unwrap();
        assert_eq!(a.training_script, *script, "{argv:?}");
        let rest: Vec<OsString> = rest.iter().map(OsString::from).collect();
        assert_eq!(a.training_script_args, rest, "{argv:?}");
    }
}

#[test]
fn script_and_arguments_keep_their_bytes() {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = |b: &[u8]| OsString::from_vec(b.to_vec());
    let argv = vec![
        OsString::from("--nproc-per-node"),
        OsString::from("2"),
        bytes(b"s\xff.py"),
        bytes(b"--lr=\xfe\x80"),
        OsString::from("${local_rank}"),
    ];
    let Ok(Invocation::Launch(a)) = parse_from(&argv, &|_| None) else {
        panic!("parses");
    };
    assert_eq!(a.training_script.as_bytes(), b"s\xff.py");
    assert_eq!(a.training_script_args, argv[3..].to_vec());
    // The same after `--`.
    let argv = vec![OsString::from("--"), bytes(b"t.py"), bytes(b"\xff")];
    let Ok(Invocation::Launch(a)) = parse_from(&argv, &|_| None) else {
        panic!("parses");
    };
    assert_eq!(a.training_script_args, vec![bytes(b"\xff")]);
    // A flag value must be text: rdrun would otherwise use a lossy copy.
    for argv in [
        vec![
            OsString::from("--role"),
            bytes(b"r\xff"),
            OsString::from("t.py"),
        ],
        vec![bytes(b"--role=r\xff"), OsString::from("t.py")],
    ] {
        let e = parse_from(&argv, &|_| None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "argument --role: the value \"r\u{fffd}\" is not valid UTF-8"
        );
    }
}

#[test]
fn values_that_look_like_flags() {
    assert_eq!(
        parse(&["--max-restarts", "-1", "t.py"])
            .unwrap()
            .max_restarts,
        -1
    );
    assert_eq!(parse(&["-r", "-1", "t.py"]).unwrap().redirects, "-1");
    assert_eq!(
        parse(&["--rdzv-conf", "-a b", "t.py"]).unwrap().rdzv_conf,
        "-a b"
    );
    assert_eq!(parse(&["--rdzv-conf=", "t.py"]).unwrap().rdzv_conf, "");
    assert_eq!(
        parse(&["--log-dir", "-", "t.py"])
            .unwrap()
            .log_dir
            .as_deref(),
        Some("-")
    );
    assert_eq!(
        err(&["--max-restarts", "-x", "t.py"]),
        "argument --max-restarts/--max_restarts: expected one argument"
    );
    assert_eq!(
        err(&["-t", "--", "t.py"]),
        "argument -t/--tee: expected one argument"
    );
    assert_eq!(
        err(&["--nnodes"]),
        "argument --nnodes: expected one argument"
    );
    // Last occurrence wins, as argparse's store.
    assert_eq!(
        parse(&["--nnodes", "1", "--nnodes", "2", "t.py"])
            .unwrap()
            .nnodes,
        "2"
    );
}

#[test]
fn usage_errors_name_the_flag_and_value() {
    assert_eq!(
        err(&[]),
        "the following arguments are required: training_script, training_script_args"
    );
    assert_eq!(
        err(&["-x"]),
        "the following arguments are required: training_script, training_script_args"
    );
    assert_eq!(err(&["--foo", "t.py"]), "unrecognized arguments: --foo");
    assert_eq!(
        err(&["--max-restarts", "abc", "t.py"]),
        "argument --max-restarts/--max_restarts: invalid int value: 'abc'"
    );
    assert_eq!(
        err(&["--monitor-interval", "fast", "t.py"]),
        "argument --monitor-interval/--monitor_interval: invalid float value: 'fast'"
    );
    assert_eq!(
        err(&["--start-method", "x", "t.py"]),
        "argument --start-method/--start_method: invalid choice: 'x' (choose from 'spawn', 'fork', 'forkserver')"
    );
    assert_eq!(
        parse_env(&["t.py"], &[("PET_MAX_RESTARTS", "two")])
            .unwrap_err()
            .to_string(),
        "argument --max-restarts/--max_restarts: invalid int value: 'two' (from PET_MAX_RESTARTS)"
    );
    // Choices are not checked for PET values (argparse), and start-method is ignored anyway.
    assert_eq!(
        parse_env(&["t.py"], &[("PET_START_METHOD", "x")])
            .unwrap()
            .start_method,
        "x"
    );
}

#[test]
fn rejected_flags() {
    assert_eq!(
        err(&["--logs-specs", "x", "t.py"]),
        "--logs-specs is not supported by rdrun: it loads a Python plugin (torchrun.logs_specs entry point)"
    );
    assert_eq!(
        parse_env(&["--numa_binding", "node", "t.py"], &[])
            .unwrap()
            .numa_binding
            .as_deref(),
        Some("node")
    );
    assert!(err(&["--numa-binding", "node", "--cpu-binding", "t.py"]).contains("choose one"));
    assert!(err(&["--numa-binding", "bogus", "t.py"]).contains("invalid choice"));
    assert_eq!(
        err(&["--event-log-handler", "dynamic_rendezvous", "t.py"]),
        "--event-log-handler dynamic_rendezvous is not supported by rdrun: only the null and console handlers exist outside Python"
    );
    assert!(parse_env(&["t.py"], &[("PET_EVENT_LOG_HANDLER", "x")]).is_err());
    // Printed at once, even without a script and before later bad words (argparse action).
    for argv in [
        &["--print-completion", "bash"][..],
        &["--print_completion=zsh", "--bogus"],
    ] {
        match parse_from(&sv(argv), &|_| None) {
            Ok(Invocation::Print(text)) => {
                assert!(text.contains("--nproc-per-node"), "{argv:?}")
            }
            other => panic!("{argv:?}: {other:?}"),
        }
    }
    assert!(err(&["--print-completion", "ksh"]).contains("invalid choice: 'ksh'"));
    assert!(
        matches!(parse_from(&sv(&["--print-man"]), &|_| None), Ok(Invocation::Print(t)) if t.starts_with(".TH RDRUN 1"))
    );
    assert!(err(&["--print-man=1"]).contains("ignored explicit argument"));
    // No PET fallback for these (as torchrun).
    assert!(parse_env(
        &["t.py"],
        &[("PET_LOGS_SPECS", "x"), ("PET_NUMA_BINDING", "node")]
    )
    .is_ok());
}

#[test]
fn python_number_text() {
    assert_eq!(python_int(" 1_0 "), Some(10));
    assert_eq!(python_int("+3"), Some(3));
    assert_eq!(python_int("-3"), Some(-3));
    for bad in ["", "1.0", "_1", "1__0", "0x10", "abc", "1_"] {
        assert_eq!(python_int(bad), None, "{bad:?}");
    }
    assert_eq!(python_float("1e-3"), Some(0.001));
    assert_eq!(python_float(" 2 "), Some(2.0));
    assert!(python_float("inf").unwrap().is_infinite());
    assert_eq!(python_float("x"), None);
}

#[test]
fn comma_lists() {
    assert_eq!(comma_separated_list("a,b"), sv(&["a", "b"]));
    assert_eq!(comma_separated_list("a,,b"), sv(&["a,b"]));
    assert_eq!(comma_separated_list(""), sv(&[""]));
}

#[test]
fn cluster_flags() {
    let a = parse(&["t.py"]).unwrap();
    assert_eq!(
        (a.cluster, a.hostfile, a.dry_run, a.print_topology),
        (None, None, false, None)
    );
    assert!(a.cli_given.is_empty());
    let a = parse(&[
        "--cluster",
        "slurm",
        "--hostfile",
        "h.txt",
        "--dry-run",
        "--print-topology",
        "--nnodes",
        "2",
        "t.py",
    ])
    .unwrap();
    assert_eq!(a.cluster.as_deref(), Some("slurm"));
    assert_eq!(a.hostfile.as_deref(), Some("h.txt"));
    assert!(a.dry_run);
    assert_eq!(a.print_topology.as_deref(), Some("text"));
    let given: Vec<&str> = a.cli_given.iter().copied().collect();
    assert_eq!(
        given,
        ["cluster", "dry_run", "hostfile", "nnodes", "print_topology"]
    );
    let a = parse(&["--print-topology=json", "t.py"]).unwrap();
    assert_eq!(a.print_topology.as_deref(), Some("json"));
    assert_eq!(
        err(&["--print-topology=yaml", "t.py"]),
        "argument --print-topology/--print_topology: invalid choice: 'yaml' (choose from 'text', 'json')"
    );
    // `--print-topology json` is the flag and then the script `json`.
    let a = parse(&["--print-topology", "json"]).unwrap();
    assert_eq!(a.training_script, "json");
    // PET_* values are not "given": the cluster layer names them itself.
    let a = parse_env(&["t.py"], &[("PET_NNODES", "2")]).unwrap();
    assert!(a.cli_given.is_empty());
    // rdrun's own flags take part in no abbreviation.
    assert_eq!(err(&["--dry", "t.py"]), "unrecognized arguments: --dry");
}

#[test]
fn help_lists_every_flag_with_default() {
    let h = help_text();
    for o in OPTIONS {
        for n in o.names {
            assert!(h.contains(n), "{n} missing from help");
        }
        if !matches!(o.kind, Kind::Help | Kind::Completion) {
            assert!(h.contains("default: "), "{}", o.dest);
        }
    }
    assert!(h.contains("[default: 1:1; env: PET_NNODES]"));
    assert!(h.contains("[default: SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2;"));
    // Stale text (issue 9/10): multi-node has been supported for a while.
    assert!(!h.contains("one node only"), "{h}");
    // The help is wrapped: a phrase may span lines.
    let flat = h.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("a worker that does not handle them dies of them"));
}
