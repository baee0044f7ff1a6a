//! In-place mode under a real Open MPI (issue 12): `mpirun -np 4 rdrun script` on one machine,
//! with no rdrun flag. Each rank's rdrun reads `OMPI_COMM_WORLD_*`, runs exactly one worker with
//! the MPI rank and size, and the four form one world whose store rank 0 hosts on loopback, on a
//! port derived from the MPI job id (`OMPI_MCA_ess_base_jobid`).
//!
//! Skipped with a message when `mpirun` is not installed (Debian's `openmpi-bin`), and the
//! PyTorch test also when the torch venv (`scripts/torch-venv.sh`) is missing.
//!
//! Across hosts: a real `mpirun` spanning two network namespaces ("hosts" `mpia`, `mpib`, each
//! with its hostname and /etc/hosts), its daemon started on the second through a launch agent
//! (`plm_rsh_agent`, in place of ssh), with a gloo all_reduce; skipped also without root
//! namespaces. In place, a failing rank's report names its real RANK and LOCAL_RANK.
//!
//! Also, without mpirun: the exact Open MPI variables of two "hosts" given to four rdruns that
//! all run on this one machine: the hostnames the ranks exchange contradict the launcher's local
//! size, which is refused by every rank instead of forming a wrong node layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::multinode::{get, records};
use crate::util::{free_port, rdrun_bin, worker, Output, Rdrun, TempDir};

const MPIRUN_TIMEOUT: Duration = Duration::from_secs(240);

fn mpirun_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}

/// What an mpirun run left: exit code (`None`: killed at the bound), stdout, stderr.
struct MpiOut {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `mpirun --oversubscribe --allow-run-as-root -np N rdrun ARGS…` with `env` added, bounded by
/// [`MPIRUN_TIMEOUT`] (then mpirun is SIGTERMed, which ends its ranks, and SIGKILLed by pid).
/// Output goes to files in `dir` so a chatty run never blocks on a pipe.
fn mpirun(mpirun: &Path, dir: &TempDir, np: usize, args: &[&str], env: &[(&str, &str)]) -> MpiOut {
    let mut argv: Vec<std::ffi::OsString> = vec![rdrun_bin().into()];
    argv.extend(args.iter().map(Into::into));
    mpirun_argv(mpirun, dir, np, &argv, env)
}

/// [`mpirun`] with the whole command of each rank given (`argv[0]` the program).
fn mpirun_argv(
    mpirun: &Path,
    dir: &TempDir,
    np: usize,
    argv: &[std::ffi::OsString],
    env: &[(&str, &str)],
) -> MpiOut {
    let mut cmd = Command::new(mpirun);
    cmd.args([
        "--oversubscribe",
        "--allow-run-as-root",
        "-np",
        &np.to_string(),
    ])
    .args(argv);
    run_bounded(cmd, dir, env)
}

/// Runs `cmd` (an mpirun, or a command that execs one) with `env` added, bounded by
/// [`MPIRUN_TIMEOUT`]: SIGTERM (mpirun then ends its ranks), 5 s, SIGKILL, by pid.
fn run_bounded(mut cmd: Command, dir: &TempDir, env: &[(&str, &str)]) -> MpiOut {
    let (out_path, err_path) = (dir.join("mpirun.out"), dir.join("mpirun.err"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    // A worker of an outer rdrun (the test harness may be one) must not look nested.
    cmd.env_remove("TORCHELASTIC_RUN_ID");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn mpirun");
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait mpirun") {
            break status.code();
        }
        if started.elapsed() > MPIRUN_TIMEOUT {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    MpiOut {
        code,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

impl MpiOut {
    #[track_caller]
    fn assert_ok(&self) {
        assert_eq!(
            self.code,
            Some(0),
            "mpirun failed\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
    }
}

/// `mpirun -np 4 rdrun inplace_allreduce.py OUT`: one world of four gloo ranks with the MPI
/// ranks, LOCAL_* from Open MPI, one node, and the sum 1+2+3+4.
#[test]
fn mpirun_four_ranks_in_place_gloo_all_reduce() {
    let Some(mpirun_bin) = mpirun_path() else {
        eprintln!("SKIP: mpirun not found (Debian's openmpi-bin installs it)");
        return;
    };
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    let dir = TempDir::new("mpi_torch");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("launcher-tests/torch/scripts/inplace_allreduce.py");
    let venv = python
        .parent()
        .and_then(Path::parent)
        .expect("venv dir")
        .to_string_lossy()
        .into_owned();
    let out = mpirun(
        &mpirun_bin,
        &dir,
        4,
        &[&script.to_string_lossy(), &dir.path().to_string_lossy()],
        // rdrun runs the activated venv's python, as for a user's.
        &[("VIRTUAL_ENV", &venv)],
    );
    out.assert_ok();
    let recs: Vec<serde_json::Value> = (0..4)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("r{r}.json")))
                .unwrap_or_else(|e| panic!("rank {r} wrote no record ({e})\n{}", out.stderr));
            serde_json::from_str(&text).expect("JSON record")
        })
        .collect();
    let port = recs[0]["MASTER_PORT"].clone();
    let run_id = recs[0]["TORCHELASTIC_RUN_ID"].clone();
    for (r, rec) in recs.iter().enumerate() {
        let s = r.to_string();
        assert_eq!(rec["dist_rank"], r, "{rec}");
        assert_eq!(rec["dist_world"], 4, "{rec}");
        assert_eq!(rec["sum"], 10.0, "all_reduce over one world of four: {rec}");
        assert_eq!(rec["RANK"], s.as_str(), "{rec}");
        assert_eq!(
            rec["OMPI_COMM_WORLD_RANK"],
            s.as_str(),
            "the MPI rank: {rec}"
        );
        assert_eq!(
            rec["LOCAL_RANK"], rec["OMPI_COMM_WORLD_LOCAL_RANK"],
            "{rec}"
        );
        assert_eq!(rec["WORLD_SIZE"], "4", "{rec}");
        assert_eq!(rec["LOCAL_WORLD_SIZE"], "4", "{rec}");
        assert_eq!(rec["GROUP_RANK"], "0", "one host: {rec}");
        assert_eq!(rec["GROUP_WORLD_SIZE"], "1", "{rec}");
        assert_eq!(rec["MASTER_ADDR"], "127.0.0.1", "{rec}");
        assert_eq!(rec["MASTER_PORT"], port, "one store: {rec}");
        assert_eq!(rec["TORCHELASTIC_RUN_ID"], run_id, "{rec}");
        assert_eq!(rec["TORCHELASTIC_USE_AGENT_STORE"], "True", "{rec}");
    }
    assert!(
        run_id.as_str().is_some_and(|id| id.starts_with("mpi-")),
        "run id from the MPI job: {run_id}"
    );
    assert!(
        out.stderr.contains("rdrun: topology  source=mpi openmpi"),
        "rank 0 prints the topology: {}",
        out.stderr
    );
}

/// The same launch with shell workers (no torch needed): every rank's environment, and that
/// OMPI_COMM_WORLD_NODE_RANK (a per-node process count) is not taken as a node index.
#[test]
fn mpirun_four_ranks_in_place_shell_workers() {
    let Some(mpirun_bin) = mpirun_path() else {
        eprintln!("SKIP: mpirun not found (Debian's openmpi-bin installs it)");
        return;
    };
    let dir = TempDir::new("mpi_shell");
    let w = worker("mn_worker");
    let out = mpirun(
        &mpirun_bin,
        &dir,
        4,
        &[&w.to_string_lossy(), &dir.path().to_string_lossy()],
        &[],
    );
    out.assert_ok();
    let recs = records(dir.path());
    assert_eq!(
        recs.len(),
        4,
        "four workers, one per rank: {recs:#?}\n{}",
        out.stderr
    );
    let ports: Vec<&str> = recs.values().map(|e| get(e, "MASTER_PORT")).collect();
    for ((gws, restart, rank), env) in &recs {
        assert_eq!((*gws, *restart), (1, 0), "one node, first attempt");
        assert_eq!(get(env, "RANK"), get(env, "OMPI_COMM_WORLD_RANK"));
        assert_eq!(get(env, "RANK"), rank.to_string());
        assert_eq!(
            get(env, "LOCAL_RANK"),
            get(env, "OMPI_COMM_WORLD_LOCAL_RANK")
        );
        assert_eq!(get(env, "WORLD_SIZE"), "4");
        assert_eq!(get(env, "LOCAL_WORLD_SIZE"), "4");
        assert_eq!(get(env, "GROUP_RANK"), "0");
        assert_eq!(get(env, "MASTER_ADDR"), "127.0.0.1");
        assert_eq!(get(env, "MASTER_PORT"), ports[0]);
    }
}

/// Rank `rank` of a 4-rank Open MPI job that claims 2 ranks per host (two hosts), with the
/// endpoint given: the variables `mpirun -np 4 --map-by ppr:2:node` sets.
fn two_host_rank_env(rank: usize, port: u16) -> Vec<(String, String)> {
    let r = rank.to_string();
    [
        ("OMPI_COMM_WORLD_RANK", r.as_str()),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", &(rank % 2).to_string()),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_COMM_WORLD_NODE_RANK", &(rank % 2).to_string()),
        ("OMPI_UNIVERSE_SIZE", "4"),
        ("OMPI_MCA_ess_base_jobid", "2218786817"),
        ("PMIX_NAMESPACE", "2218786817"),
        ("PMIX_RANK", r.as_str()),
        ("RDRUN_RDZV_ENDPOINT", &format!("127.0.0.1:{port}")),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Node identity comes from the hostnames the ranks exchange, not from the variables: four ranks
/// that say "two per host" but all run on this machine are refused by every rank, naming the
/// host, and no worker starts.
#[test]
fn mpi_ranks_whose_hostnames_contradict_the_local_size_are_refused() {
    let dir = TempDir::new("mpi_hosts");
    let port = free_port();
    let runs: Vec<_> = (0..4)
        .map(|r| {
            let mut run = Rdrun::new().timeout(Duration::from_secs(120));
            for (k, v) in two_host_rank_env(r, port) {
                run = run.env(k, v);
            }
            run.arg(worker("mn_worker")).arg(dir.path()).spawn()
        })
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
    let me = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("UTF-8 hostname");
    for (r, o) in outs.iter().enumerate() {
        o.assert_code(1);
        assert!(
            o.stderr.contains(&format!(
                "in-place rank {r}: 4 ranks name host {me:?} but the launcher says 2 share this node"
            )),
            "rank {r}: {}",
            o.stderr
        );
    }
    let recs: BTreeMap<_, _> = records(dir.path());
    assert!(recs.is_empty(), "no worker started: {recs:#?}");
}

/// In place, the failure report names the failing rank's real identity: under `mpirun -np 4`
/// rank 2 fails (one host, so its Open MPI local rank is 2), and its rdrun's report block and
/// `--report-json` say rank 2 and local_rank 2 — not the agent's slot 0 (before:
/// `rank      : 2 (local_rank: 0)`). Each rank's rdrun gets its own JSON path from a shell
/// wrapper (the ranks the failure stops may write a report too).
#[test]
fn mpirun_in_place_failure_report_names_the_real_local_rank() {
    let Some(mpirun_bin) = mpirun_path() else {
        eprintln!("SKIP: mpirun not found (Debian's openmpi-bin installs it)");
        return;
    };
    let dir = TempDir::new("mpi_report");
    let argv: Vec<std::ffi::OsString> = vec![
        "sh".into(),
        "-c".into(),
        r#"exec "$0" --report-json "$1/report.$OMPI_COMM_WORLD_RANK.json" "$2" "$1""#.into(),
        rdrun_bin().into(),
        dir.path().into(),
        worker("mn_worker").into(),
    ];
    let out = mpirun_argv(&mpirun_bin, &dir, 4, &argv, &[("MN_FAIL_RANK", "2")]);
    assert!(
        out.code.is_some_and(|c| c != 0),
        "rank 2 failed, mpirun ended with an error: {:?}\n{}",
        out.code,
        out.stderr
    );
    let recs = records(dir.path());
    let env2 = recs
        .iter()
        .find(|((_, _, r), _)| *r == 2)
        .map(|(_, e)| e)
        .unwrap_or_else(|| panic!("rank 2 ran: {recs:#?}\n{}", out.stderr));
    assert_eq!(get(env2, "LOCAL_RANK"), "2", "one host: {env2:?}");
    assert!(
        out.stderr.contains("rank      : 2 (local_rank: 2)"),
        "the report names rank 2 with its real local rank:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("rank      : 2 (local_rank: 0)"),
        "{}",
        out.stderr
    );
    // The failure log line names the scheduler's LOCAL_RANK too (it said 0 before: the slot).
    assert!(
        out.stderr.contains("local_rank: 2 (pid:"),
        "the failure log line names local_rank 2:\n{}",
        out.stderr
    );
    let text = std::fs::read_to_string(dir.join("report.2.json"))
        .unwrap_or_else(|e| panic!("rank 2's rdrun wrote its JSON report ({e})\n{}", out.stderr));
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON report");
    let f = &report["failures"][0];
    assert_eq!(f["rank"], 2, "{report}");
    assert_eq!(f["local_rank"], 2, "{report}");
    assert_eq!(
        report["failures"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
}

/// mpirun's remote launch agent (`plm_rsh_agent`) for hosts that are network namespaces:
/// Open MPI runs `AGENT HOST ARGS…` as it would `ssh HOST ARGS…`, the arguments being one shell
/// command line to re-parse; the agent runs it in HOST's namespace under its own UTS namespace
/// with HOST as hostname (as sshd would on that machine), and logs each launch to `log`.
fn namespace_agent(dir: &TempDir, hosts: &[(&str, String)], log: &Path) -> PathBuf {
    let cases: String = hosts
        .iter()
        .map(|(h, ns)| format!("  {h}) ns={ns} ;;\n"))
        .collect();
    let script = format!(
        "#!/bin/sh\n\
         host=$1; shift\n\
         case \"$host\" in\n{cases}  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\nesac\n\
         echo \"$host $*\" >> '{log}'\n\
         exec ip netns exec \"$ns\" unshare --uts sh -c 'hostname \"$0\" && exec sh -c \"$1\"' \"$host\" \"$*\"\n",
        log = log.display()
    );
    let path = dir.join("agent");
    std::fs::write(&path, script).expect("write agent");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod agent");
    path
}

/// A real `mpirun` across two hosts (network namespaces `mpia`, `mpib`, each with its hostname
/// and /etc/hosts): mpirun runs on mpia, starts Open MPI's daemon on mpib through the
/// launch agent, `-np 4 --map-by node` puts ranks 0, 2 on mpia and 1, 3 on mpib, and every
/// rank's rdrun (no rdrun flag) joins one world whose store rank 0 hosts on mpia (the default
/// hostfile's first host, a port from the MPI job id). A PyTorch gloo all_reduce across the
/// hosts sums 1+2+3+4; ranks, local ranks and GROUP_RANK follow the hosts the ranks ran on.
#[test]
fn mpirun_across_two_hosts_gloo_all_reduce() {
    let Some(mpirun_bin) = mpirun_path() else {
        eprintln!("SKIP: mpirun not found (Debian's openmpi-bin installs it)");
        return;
    };
    let Some(python) = crate::util::torch_python() else {
        return;
    };
    crate::netns::bounded(Duration::from_secs(400), move || {
        let names: [&[&str]; 2] = [&["mpia"], &["mpib"]];
        let hosts = crate::cluster::hosts_of(&names);
        let Some(pods) = crate::cluster::Pods::new(&[hosts.clone(), hosts]) else {
            return;
        };
        let dir = TempDir::new("mpi_2hosts_torch");
        let log = dir.join("agent.log");
        let agent = namespace_agent(
            &dir,
            &[("mpia", pods.net.name(0)), ("mpib", pods.net.name(1))],
            &log,
        );
        let hostfile = dir.join("hostfile");
        std::fs::write(&hostfile, "mpia slots=2\nmpib slots=2\n").expect("hostfile");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("launcher-tests/torch/scripts/inplace_allreduce.py");
        let venv = python
            .parent()
            .and_then(Path::parent)
            .expect("venv dir")
            .to_string_lossy()
            .into_owned();
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &pods.net.name(0),
            "unshare",
            "--uts",
            "sh",
            "-c",
        ])
        .arg("hostname \"$0\" && exec \"$@\"")
        .arg("mpia")
        .arg(&mpirun_bin)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(["--map-by", "node"])
        .arg("--mca")
        .arg("plm_rsh_agent")
        .arg(&agent)
        .arg("--mca")
        .arg("orte_default_hostfile")
        .arg(&hostfile)
        .args(["-x", "VIRTUAL_ENV", "-x", "PYTHONUNBUFFERED"])
        .arg(rdrun_bin())
        .arg(&script)
        .arg(dir.path());
        let out = run_bounded(
            cmd,
            &dir,
            &[("VIRTUAL_ENV", &venv), ("PYTHONUNBUFFERED", "1")],
        );
        out.assert_ok();
        let launched = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            launched.starts_with("mpib ") && launched.contains("orted"),
            "Open MPI's daemon was started on mpib through the agent: {launched:?}"
        );
        for r in 0..4usize {
            let text = std::fs::read_to_string(dir.join(format!("r{r}.json")))
                .unwrap_or_else(|e| panic!("rank {r} wrote no record ({e})\n{}", out.stderr));
            let rec: serde_json::Value = serde_json::from_str(&text).expect("JSON record");
            let host = r % 2;
            assert_eq!(rec["host"], names[host][0], "--map-by node: {rec}");
            assert_eq!(rec["dist_rank"], r, "{rec}");
            assert_eq!(rec["dist_world"], 4, "{rec}");
            assert_eq!(
                rec["sum"], 10.0,
                "one world of four across two hosts: {rec}"
            );
            assert_eq!(rec["RANK"], r.to_string().as_str(), "{rec}");
            assert_eq!(rec["OMPI_COMM_WORLD_RANK"], r.to_string().as_str(), "{rec}");
            assert_eq!(rec["LOCAL_RANK"], (r / 2).to_string().as_str(), "{rec}");
            assert_eq!(
                rec["LOCAL_RANK"], rec["OMPI_COMM_WORLD_LOCAL_RANK"],
                "{rec}"
            );
            assert_eq!(rec["WORLD_SIZE"], "4", "{rec}");
            assert_eq!(rec["LOCAL_WORLD_SIZE"], "2", "{rec}");
            assert_eq!(rec["GROUP_RANK"], host.to_string().as_str(), "{rec}");
            assert_eq!(rec["GROUP_WORLD_SIZE"], "2", "{rec}");
            assert_eq!(rec["MASTER_ADDR"], "mpia", "{rec}");
        }
        assert!(
            out.stderr.contains("rdrun: topology  source=mpi openmpi"),
            "{}",
            out.stderr
        );
    });
}
