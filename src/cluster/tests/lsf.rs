//! Detection tests: LSF host lists.

use super::*;

#[test]
fn lsf_host_lists() {
    let e = [("LSB_JOBID", "1234"), ("LSB_HOSTS", "batch1 hA hA hB hB")];
    let t = ok(&e, "hB.example.org");
    assert_eq!(t.scheduler, "lsf (job 1234)");
    assert_eq!(val(&t.fields.node_rank).0, 1);
    assert_eq!(val(&t.fields.nnodes), (nn(2), "LSB_HOSTS".into()));
    assert_eq!(val(&t.fields.node_list).0, vec!["hA", "hB"]);
    assert!(t
        .notes
        .iter()
        .any(|n| n.contains("dropped launch node batch1")));
    assert_eq!(err(&e, "hC"), "own host hC is missing from LSB_HOSTS");
    assert!(err(&[("LSB_JOBID", "1"), ("LSB_MCPU_HOSTS", "hA 4 hB")], "hA").contains("pairs"));
    let files = |p: &str| {
        if p == "/lsf/hosts" {
            Ok("hA\nhA\nhB\n".to_string())
        } else {
            Err(format!("{p}: no such file"))
        }
    };
    let host = HostFacts {
        read_file: &files,
        ..HostFacts::named("hA")
    };
    let t = detect_on(
        &[("LSB_JOBID", "1"), ("LSB_DJOB_HOSTFILE", "/lsf/hosts")],
        &host,
        &Fields::default(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(val(&t.fields.node_rank).0, 0);
    assert_eq!(val(&t.fields.nnodes).0, nn(2));
}
