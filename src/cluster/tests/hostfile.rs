//! Detection tests: Hostfiles in both dialects, the DeepSpeed `--include`/`--exclude` filter, IPv6 literals.

use super::*;

#[test]
fn hostfiles_in_both_dialects() {
    let files = |p: &str| {
        match p {
        "/hf" => Ok("# DeepSpeed and Open MPI lines\nworker-0 slots=4\nworker-1:2 // comment\n\nworker-2 slots=2 max_slots=8\nworker-0 slots=4\n".to_string()),
        "/bad" => Ok("worker-0 slots=x\n".to_string()),
        p => Err(format!("{p}: no such file")),
    }
    };
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("worker-1")
    };
    let t = detect_on(&[("RDRUN_HOSTFILE", "/hf")], &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(t.scheduler, "hostfile (/hf)");
    let f = &t.fields;
    assert_eq!(val(&f.node_rank).0, 1);
    assert_eq!(val(&f.nnodes).0, nn(3));
    assert_eq!(val(&f.master_addr).0, "worker-0");
    assert_eq!(
        val(&f.nproc),
        (
            "2".into(),
            "slots of this host in hostfile /hf (RDRUN_HOSTFILE)".into()
        )
    );
    assert!(t
        .notes
        .iter()
        .any(|n| n.contains("worker-0 listed more than once")));
    // Matched by a local address; two matches are an error naming both.
    let host = HostFacts {
        read_file: &files,
        addresses: vec!["worker-2".into(), "worker-0".into()],
        ..HostFacts::named("box")
    };
    let e = detect_on(
        &[("OMPI_MCA_orte_default_hostfile", "/hf")],
        &host,
        &Fields::default(),
    )
    .unwrap_err()
    .0;
    assert_eq!(e, "hostfile /hf (OMPI_MCA_orte_default_hostfile): this host (box) matches several entries: worker-0, worker-2");
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("worker-0")
    };
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/bad")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "/bad:1: bad slot count in \"worker-0 slots=x\""
    );
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/none")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "hostfile /none (RDRUN_HOSTFILE): /none: no such file"
    );
    let flags = Fields {
        hostfile: src("/hf".into(), "--hostfile"),
        ..Fields::default()
    };
    let t = detect_on(&[], &host, &flags).unwrap().unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 0);
}

#[test]
fn deepspeed_documented_include_exclude() {
    use readers::resource_filter as rf;
    let hosts = vec![("worker-0".to_string(), 4), ("worker-1".to_string(), 4)];
    let m = |v: &[(&str, &[usize])]| {
        v.iter()
            .map(|(h, s)| (h.to_string(), s.to_vec()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rf(&hosts, Some("worker-0@worker-1:0,2"), None).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3]), ("worker-1", &[0, 2])])
    );
    assert_eq!(
        rf(&hosts, None, Some("worker-1:0")).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3]), ("worker-1", &[1, 2, 3])])
    );
    assert_eq!(
        rf(&hosts, None, Some("worker-1")).unwrap(),
        m(&[("worker-0", &[0, 1, 2, 3])])
    );
    assert_eq!(
        rf(&hosts, Some("worker-1:0@worker-1:2"), None).unwrap(),
        m(&[("worker-1", &[0, 2])])
    );
    assert_eq!(
        rf(&hosts, Some("worker-2"), None).unwrap_err().0,
        "--include \"worker-2\": host \"worker-2\" is not in the hostfile"
    );
    assert_eq!(
        rf(&hosts, Some("worker-1:9"), None).unwrap_err().0,
        "--include \"worker-1:9\": No slot '9' specified on host 'worker-1'"
    );
    assert!(rf(&hosts, Some("worker-0"), Some("worker-1"))
        .unwrap_err()
        .0
        .contains("mutually exclusive"));
    assert_eq!(rf(&hosts, None, None).unwrap().len(), 2);
}

#[test]
fn hostfile_filters_with_deepspeeds_documented_semantics() {
    let read = |_: &str| Ok("worker-0 slots=4\nworker-1 slots=4\n".to_string());
    let on = |me: &'static str| HostFacts {
        read_file: &read,
        ..HostFacts::named(me)
    };
    let flags = |inc: Option<&str>, exc: Option<&str>| Fields {
        hostfile: src("/hf".into(), "--hostfile"),
        include: inc.and_then(|v| src(v.to_string(), "--include")),
        exclude: exc.and_then(|v| src(v.to_string(), "--exclude")),
        ..Fields::default()
    };
    let run = |me, inc, exc| detect_on(&[], &on(me), &flags(inc, exc));
    // -i "worker-0@worker-1:0,2": worker-0 whole, worker-1 slots 0 and 2 (DeepSpeed's CLI would
    // drop worker-0 since PR #6530).
    let t = run("worker-1", Some("worker-0@worker-1:0,2"), None)
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(
        val(&t.fields.nproc),
        ("2".into(), readers::FILTER_DEVICES.into())
    );
    assert_eq!(val(&t.fields.devices).0, vec!["0".to_string(), "2".into()]);
    let t = run("worker-0", Some("worker-0@worker-1:0,2"), None)
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.devices).0, vec!["0", "1", "2", "3"]);
    // -e worker-0: worker-1 alone is node 0 and the endpoint.
    let t = run("worker-1", None, Some("worker-0"))
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.nnodes).0, nn(1));
    assert_eq!(val(&t.fields.node_rank).0, 0);
    assert_eq!(val(&t.fields.master_addr).0, "worker-1");
    // -e "worker-1:0": slots 1,2,3 there.
    let t = run("worker-1", None, Some("worker-1:0"))
        .expect("ok")
        .expect("topology");
    assert_eq!(val(&t.fields.devices).0, vec!["1", "2", "3"]);
    // Errors: an excluded host, an unknown host or slot, both filters, a filter without a hostfile.
    let e = run("worker-1", None, Some("worker-1")).unwrap_err().0;
    assert_eq!(e, "this host (worker-1) is left out of hostfile /hf (--hostfile) by --exclude: it takes no part in the job; start rdrun only on worker-0");
    let e = run("worker-0", Some("worker-2"), None).unwrap_err().0;
    assert_eq!(
        e,
        "--include \"worker-2\": host \"worker-2\" is not in the hostfile"
    );
    let e = run("worker-0", Some("worker-1:9"), None).unwrap_err().0;
    assert_eq!(
        e,
        "--include \"worker-1:9\": No slot '9' specified on host 'worker-1'"
    );
    let e = run("worker-0", Some("worker-0"), Some("worker-1"))
        .unwrap_err()
        .0;
    assert_eq!(e, "--include and --exclude are mutually exclusive");
    let no_file = Fields {
        include: src("a".into(), "--include"),
        ..Fields::default()
    };
    let e = detect_on(&[], &HostFacts::named("x"), &no_file)
        .unwrap_err()
        .0;
    assert!(
        e.starts_with("--include/--exclude filter a hostfile's hosts, and no hostfile is named"),
        "{e}"
    );
    let bare = |_: &str| Ok("worker-0\nworker-1 slots=2\n".to_string());
    let host = HostFacts {
        read_file: &bare,
        ..HostFacts::named("worker-1")
    };
    let e = detect_on(&[], &host, &flags(Some("worker-1:0"), None))
        .unwrap_err()
        .0;
    assert_eq!(e, "--include/--exclude select slots, but worker-0 has no slots=N in hostfile /hf (--hostfile)");
}

/// An IPv6-only cluster's hostfile of bare address literals (one bracketed): this host is the
/// entry assigned to one of its interfaces (compared as addresses, not text), MASTER_ADDR is the
/// first literal without brackets, and the one-line summary brackets the endpoint. Before, no
/// interface address was ever consulted ("own host ... is missing").
#[test]
fn hostfile_of_ipv6_literals_matches_this_hosts_address() {
    let files = |p: &str| match p {
        "/hf6" => Ok("fd00:231::1 slots=1\n[fd00:231::2] slots=1\n".to_string()),
        p => Err(format!("{p}: no such file")),
    };
    let mine: std::net::IpAddr = "fd00:231:0:0::2".parse().unwrap();
    let local = move |ip: std::net::IpAddr| ip == mine;
    let host = HostFacts {
        read_file: &files,
        is_local_ip: &local,
        ..HostFacts::named("v6-worker-1")
    };
    let t = detect_on(&[("RDRUN_HOSTFILE", "/hf6")], &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
    assert_eq!(val(&t.fields.master_addr).0, "fd00:231::1");
    assert_eq!(
        render::one_line(&t),
        "rdrun: node 1/2 -> endpoint [fd00:231::1]:29500 (hostfile (/hf6)), mode node"
    );
    // Not this machine's address: still missing, with the usual error.
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("v6-worker-1")
    };
    assert_eq!(
        detect_on(&[("RDRUN_HOSTFILE", "/hf6")], &host, &Fields::default())
            .unwrap_err()
            .0,
        "own host v6-worker-1 is missing from hostfile /hf6 (RDRUN_HOSTFILE)"
    );
    assert_eq!(host_port("fd00::1", "1"), "[fd00::1]:1");
    assert_eq!(host_port("[fd00::1]", "1"), "[fd00::1]:1");
    assert_eq!(host_port("n1", "1"), "n1:1");
    assert_eq!(host_port("10.0.0.1", "1"), "10.0.0.1:1");
}
