//! etcd endpoints, credentials and TLS as a user gives them: unreachable members, auth that
//! does not cover the key prefix, TLS settings without the feature (one-line errors), and with
//! feature `etcd-tls` an etcd that requires client certificates (a CA, server and client
//! certificates made with `openssl` at test time), a job over it, a wrong CA and a missing
//! client certificate. A child module of `etcd` (its harness; `etcd::` selects these too).

use super::*;

/// A loopback etcd cluster of `n` members on free ports (healthy); `None` with a message when
/// etcd is not installed.
fn loopback_cluster(n: usize) -> Option<Cluster> {
    let Some(etcd) = etcd_bin() else {
        eprintln!("SKIPPED: etcd not installed (Debian: etcd-server etcd-client)");
        return None;
    };
    let specs: Vec<MemberSpec> = (0..n)
        .map(|_| MemberSpec {
            addr: "127.0.0.1".into(),
            client: free_port(),
            peer: free_port(),
            netns: None,
        })
        .collect();
    let c = Cluster::start_with(&etcd, &specs, "http", &[]);
    c.wait_healthy(Cluster::healthy);
    Some(c)
}

/// Bad input: unreachable members, TLS settings without the `etcd-tls` feature, an etcd with
/// auth on (a wrong password; a user whose role does not cover the key prefix), and the v2
/// backend: one-line errors naming what failed.
#[test]
fn bad_endpoints_auth_and_prefix_are_one_line_errors() {
    let Some(etcd) = loopback_cluster(1) else {
        return;
    };
    let dir = TempDir::new("etcd-bad");
    let run = |eps: &str, conf: &str| {
        let t0 = Instant::now();
        let o = agent(&dir, eps, "bad", "2", Some(1), conf)
            .timeout(Duration::from_secs(60))
            .run();
        assert_eq!(o.code, Some(1), "{o:?}");
        assert!(t0.elapsed() < Duration::from_secs(30), "bounded: {o:?}");
        let line = o
            .stderr
            .lines()
            .find(|l| l.contains("error") && l.contains("etcd rendezvous at"))
            .unwrap_or_else(|| panic!("no error line: {o:?}"))
            .to_string();
        line
    };
    let dead = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let line = run(&dead, "");
    assert!(line.contains(&dead.replace(',', ", ")), "{line}");
    assert!(line.contains("no member answered"), "{line}");

    // TLS settings in a build without TLS say which feature to build with.
    #[cfg(not(feature = "etcd-tls"))]
    {
        let line = run(&etcd.list(), "cacert=/nonexistent/ca.pem");
        assert!(line.contains("`etcd-tls` cargo feature"), "{line}");
    }

    // Auth: root (needed to enable it) and a user limited to /allowed/.
    for args in [
        &[
            "user",
            "add",
            "root",
            "--new-user-password=rootpw",
            "--interactive=false",
        ][..],
        &["role", "add", "r"],
        &[
            "role",
            "grant-permission",
            "r",
            "--prefix=true",
            "readwrite",
            "/allowed/",
        ],
        &[
            "user",
            "add",
            "u",
            "--new-user-password=upw",
            "--interactive=false",
        ],
        &["user", "grant-role", "u", "r"],
        &["auth", "enable"],
    ] {
        let o = etcd.ctl(args);
        assert!(o.status.success(), "etcdctl {args:?}: {o:?}");
    }
    let eps = etcd.list();
    let line = run(&eps, "username=u,password=wrong,key_prefix=/allowed");
    assert!(line.contains("authentication failed (user u)"), "{line}");
    let line = run(&eps, "username=u,password=upw,key_prefix=/elsewhere");
    assert!(
        line.contains("permission denied for keys under /elsewhere/"),
        "{line}"
    );
    // The same user inside its prefix gets past the checks (and then waits for a 2nd node).
    let o = agent(
        &dir,
        &eps,
        "bad",
        "2",
        Some(1),
        "username=u,password=upw,key_prefix=/allowed,join_timeout=2",
    )
    .run();
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("rendezvous timed out"), "{o:?}");

    let o = Rdrun::new()
        .args([
            "--nnodes",
            "2",
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            &eps,
        ])
        .args(["--no-python", "true"])
        .run();
    assert_eq!(o.code, Some(2), "{o:?}");
    assert!(
        o.stderr.contains("v2 API is gone") && o.stderr.contains("etcd-v3"),
        "{o:?}"
    );
}

/// `openssl` with `args` in `dir`; panics with its output when it fails.
#[cfg(feature = "etcd-tls")]
fn openssl(dir: &TempDir, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run openssl");
    assert!(o.status.success(), "openssl {args:?}: {o:?}");
}

/// A self-signed CA `<name>.pem` + `<name>.key` (P-256) in `dir`.
#[cfg(feature = "etcd-tls")]
fn make_ca(dir: &TempDir, name: &str) {
    let (pem, key) = (format!("{name}.pem"), format!("{name}.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &format!("/CN=rdrun test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A certificate `<name>.pem` + `<name>.key` signed by CA `ca`, with the extensions `ext`.
#[cfg(feature = "etcd-tls")]
fn make_cert(dir: &TempDir, name: &str, ca: &str, ext: &str) {
    let (pem, key, csr) = (
        format!("{name}.pem"),
        format!("{name}.key"),
        format!("{name}.csr"),
    );
    let extfile = format!("{name}.ext");
    std::fs::write(dir.join(&extfile), ext).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
            "-extfile",
            &extfile,
        ],
    );
}

/// TLS (feature `etcd-tls`): an etcd that requires client certificates (a CA, server and
/// client certificates made with `openssl` here); a 2-node job over it with
/// `cacert`/`cert`/`key`; a wrong CA and a missing client certificate are one-line errors
/// naming the endpoint and the TLS failure, within a bound.
#[cfg(feature = "etcd-tls")]
#[test]
fn tls_etcd_with_client_certificates_and_bad_certificates() {
    bounded(TEST_TIMEOUT, || {
        let Some(etcd) = etcd_bin() else {
            eprintln!("SKIPPED: etcd not installed (Debian: etcd-server etcd-client)");
            return;
        };
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("SKIPPED: openssl not installed (makes the test certificates)");
            return;
        }
        let pki = TempDir::new("etcd-pki");
        make_ca(&pki, "ca");
        make_ca(&pki, "other");
        // etcd 3.4's gateway dials its own gRPC with the server certificate: clientAuth too.
        make_cert(
            &pki,
            "server",
            "ca",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        );
        make_cert(&pki, "client", "ca", "extendedKeyUsage=clientAuth\n");
        let f = |name: &str| pki.join(name).to_string_lossy().into_owned();
        let spec = MemberSpec {
            addr: "127.0.0.1".into(),
            client: free_port(),
            peer: free_port(),
            netns: None,
        };
        let extra = strings(&[
            "--cert-file",
            &f("server.pem"),
            "--key-file",
            &f("server.key"),
            "--trusted-ca-file",
            &f("ca.pem"),
            "--client-cert-auth",
        ]);
        let cluster = Cluster::start_with(&etcd, &[spec], "https", &extra);
        let (ca, cert, key) = (f("ca.pem"), f("client.pem"), f("client.key"));
        cluster.wait_healthy(|c| {
            c.ctl(&[
                "--cacert", &ca, "--cert", &cert, "--key", &key, "put", "/health", "1",
            ])
            .status
            .success()
        });
        let eps = cluster.list();

        let dir = TempDir::new("etcd-tls");
        let good = format!("cacert={ca},cert={cert},key={key}");
        let running: Vec<_> = (1..=2)
            .map(|h| agent(&dir, &eps, "tls", "2", Some(h), &good).spawn())
            .collect();
        let outs: Vec<Output> = running.into_iter().map(|r| r.wait()).collect();
        assert_ok(&outs);
        check_round(&records(dir.path()), 2, 0, Some(&[1, 1]));

        let fails = |conf: &str| {
            let t0 = Instant::now();
            let o = agent(&dir, &eps, "tlsbad", "2", Some(1), conf)
                .timeout(Duration::from_secs(60))
                .run();
            assert_eq!(o.code, Some(1), "{o:?}");
            assert!(t0.elapsed() < Duration::from_secs(30), "bounded: {o:?}");
            o.stderr
                .lines()
                .find(|l| l.contains("error") && l.contains("etcd rendezvous at"))
                .unwrap_or_else(|| panic!("no error line: {o:?}"))
                .to_string()
        };
        let other = f("other.pem");
        let line = fails(&format!("cacert={other},cert={cert},key={key}"));
        eprintln!("wrong CA: {line}");
        assert!(line.contains(&eps), "{line}");
        assert!(line.contains("TLS"), "{line}");
        assert!(line.contains("certificate"), "{line}");
        let line = fails(&format!("cacert={ca}"));
        eprintln!("no client certificate: {line}");
        assert!(line.contains(&eps), "{line}");
        assert!(line.contains("TLS"), "{line}");
    });
}
