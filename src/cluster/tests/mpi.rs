//! Detection tests: Open MPI / MPICH / MVAPICH2 on one host and across hosts.

use super::*;

#[test]
fn mpi_on_one_host_needs_no_endpoint() {
    let host = HostFacts {
        ppid: Some(4242),
        ..HostFacts::named("box")
    };
    let t = detect_on(OMPI_ONE_HOST, &host, &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(t.scheduler, "mpi openmpi");
    let f = &t.fields;
    assert_eq!(val(&f.mode).0, Mode::InPlace);
    assert_eq!(val(&f.rank), (2, "OMPI_COMM_WORLD_RANK".into()));
    assert_eq!(val(&f.world_size).0, 4);
    assert_eq!(val(&f.local_world_size).0, 4);
    assert_eq!(val(&f.nnodes).0, nn(1));
    assert_eq!(val(&f.master_addr).0, "127.0.0.1");
    assert_eq!(
        val(&f.master_port),
        (
            derived_port(4242, 0),
            "derived from parent pid (the MPI launcher)".into()
        )
    );
    // Every rank of the job derives the same port from the job id when there is one.
    let with_job = with(OMPI_ONE_HOST, &[("OMPI_MCA_ess_base_jobid", "3045457921")]);
    let a = detect_on(&with_job, &host, &Fields::default())
        .unwrap()
        .unwrap();
    let b = detect_on(&with_job, &HostFacts::named("box"), &Fields::default())
        .unwrap()
        .unwrap();
    assert_eq!(a.fields.master_port, b.fields.master_port);
    assert_eq!(
        val(&a.fields.master_port).1,
        "derived from OMPI_MCA_ess_base_jobid"
    );
}

#[test]
fn mpi_across_hosts() {
    let two = with(
        OMPI_ONE_HOST,
        &[("OMPI_COMM_WORLD_SIZE", "8"), ("OMPI_COMM_WORLD_RANK", "6")],
    );
    assert_eq!(err(&two, "hB"), "mpi openmpi: a multi-node job but no endpoint in the environment; pass --rdzv-endpoint (or RDRUN_RDZV_ENDPOINT)");
    // LSF supplies the host list: MPI keeps the ranks, LSF gives endpoint and node rank.
    let lsf = with(
        &two,
        &[("LSB_JOBID", "55"), ("LSB_MCPU_HOSTS", "hA 4 hB 4")],
    );
    let t = ok(&lsf, "hB");
    assert_eq!(t.scheduler, "mpi openmpi");
    assert_eq!(val(&t.fields.rank).0, 6);
    assert_eq!(
        val(&t.fields.node_rank),
        (1, "position of this host in LSB_MCPU_HOSTS".into())
    );
    assert_eq!(
        val(&t.fields.master_addr),
        ("hA".into(), "first host of LSB_MCPU_HOSTS".into())
    );
    // An explicit endpoint suffices.
    let flags = Fields {
        master_addr: src("10.0.0.5".into(), "--rdzv-endpoint"),
        ..Fields::default()
    };
    assert!(detect_on(&two, &HostFacts::named("hB"), &flags).is_ok());
    // One rank per host: node mode with node rank = rank.
    let per_host = [
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("MPI_LOCALRANKID", "0"),
        ("MPI_LOCALNRANKS", "1"),
        ("RDRUN_RDZV_ENDPOINT", "h0:29400"),
    ];
    let t = ok(&per_host, "h1");
    assert_eq!(t.scheduler, "mpi mpich");
    assert_eq!(val(&t.fields.mode).0, Mode::Node);
    assert_eq!(val(&t.fields.node_rank), (1, "PMI_RANK".into()));
    assert_eq!(val(&t.fields.nnodes), (nn(2), "PMI_SIZE".into()));
    assert_eq!(
        val(&t.fields.master_port),
        (29400, "RDRUN_RDZV_ENDPOINT".into())
    );
    assert_eq!(err(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")], "h"), "PMI_RANK/PMI_SIZE without MPI_LOCALRANKID/MPI_LOCALNRANKS: cannot tell how many ranks share this host");
    let mv = [
        ("MV2_COMM_WORLD_RANK", "0"),
        ("MV2_COMM_WORLD_SIZE", "2"),
        ("MV2_COMM_WORLD_LOCAL_RANK", "0"),
        ("MV2_COMM_WORLD_LOCAL_SIZE", "2"),
    ];
    let host = HostFacts {
        ppid: Some(9),
        ..HostFacts::named("h")
    };
    assert_eq!(
        detect_on(&mv, &host, &Fields::default())
            .unwrap()
            .unwrap()
            .scheduler,
        "mpi mvapich2"
    );
}
