//! The worker environment contract (spec torchrun-compat §2): every variable torchrun sets, with
//! torchrun's values, for nproc 1 and 4; inheritance; `${local_rank}` substitution;
//! `--virtual-local-rank`; each worker in its own session and process group; arguments passed
//! byte for byte; no descriptor beyond stdio (cold, warm, health checks).

use std::collections::BTreeMap;

use crate::util::{parse_env0, worker, Rdrun, TempDir};

/// Runs `print_env` under rdrun and returns each local rank's environment.
fn envs(
    dir: &TempDir,
    nproc: usize,
    rdrun: Rdrun,
    extra: &[&str],
) -> Vec<BTreeMap<String, String>> {
    let out = rdrun
        .arg("--standalone")
        .arg(format!("--nproc-per-node={nproc}"))
        .arg("--no-python")
        .arg(worker("print_env"))
        .arg(dir.path())
        .args(extra)
        .run();
    out.assert_code(0);
    (0..nproc)
        .map(|lr| {
            let text = std::fs::read_to_string(dir.join(format!("env.{lr}.0")))
                .unwrap_or_else(|e| panic!("rank {lr} wrote no env: {e}: {out:?}"));
            parse_env0(&text)
        })
        .collect()
}

fn contract(nproc: usize) {
    let dir = TempDir::new("env_contract");
    let all = envs(
        &dir,
        nproc,
        Rdrun::new()
            .env("RDRUN_TEST_INHERITED", "kept as is")
            .env_remove("PYTHONUNBUFFERED")
            .env_remove("NODE_RANK"),
        &[],
    );
    let port = all[0]["MASTER_PORT"].clone();
    let run_id = all[0]["TORCHELASTIC_RUN_ID"].clone();
    assert!(
        port.parse::<u16>().is_ok_and(|p| p > 0),
        "MASTER_PORT {port}"
    );
    assert!(!run_id.is_empty());
    for (lr, env) in all.iter().enumerate() {
        let n = nproc.to_string();
        let l = lr.to_string();
        let want: &[(&str, &str)] = &[
            ("RANK", &l),
            ("LOCAL_RANK", &l),
            ("WORLD_SIZE", &n),
            ("LOCAL_WORLD_SIZE", &n),
            ("GROUP_RANK", "0"),
            ("GROUP_WORLD_SIZE", "1"),
            ("ROLE_RANK", &l),
            ("ROLE_WORLD_SIZE", &n),
            ("ROLE_NAME", "default"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("TORCHELASTIC_RESTART_COUNT", "0"),
            ("TORCHELASTIC_MAX_RESTARTS", "0"),
            ("TORCHELASTIC_RUN_ID", &run_id),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ("RDRUN_TEST_INHERITED", "kept as is"),
        ];
        for (k, v) in want {
            assert_eq!(
                env.get(*k).map(String::as_str),
                Some(*v),
                "{k} of rank {lr}"
            );
        }
        assert!(env.contains_key("TORCHELASTIC_ERROR_FILE"), "rank {lr}");
        let signals = &env["TORCHELASTIC_SIGNALS_TO_HANDLE"];
        for name in ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"] {
            assert!(signals.split(',').any(|s| s == name), "{signals}");
        }
        // torchrun sets OMP_NUM_THREADS=1 only when nproc > 1 and the user did not set it.
        let omp = env.get("OMP_NUM_THREADS").map(String::as_str);
        assert_eq!(omp, if nproc > 1 { Some("1") } else { None }, "rank {lr}");
        for absent in ["NODE_RANK", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES"] {
            assert!(!env.contains_key(absent), "{absent} set for rank {lr}");
        }
    }
}

#[test]
fn contract_nproc_1() {
    contract(1);
}

#[test]
fn contract_nproc_4() {
    contract(4);
}

#[test]
fn user_values_are_kept() {
    let dir = TempDir::new("env_user_values");
    let all = envs(
        &dir,
        2,
        Rdrun::new()
            .env("OMP_NUM_THREADS", "7")
            .env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
            .env("CUDA_VISIBLE_DEVICES", "3,1"),
        &[],
    );
    for env in &all {
        assert_eq!(env["OMP_NUM_THREADS"], "7");
        assert_eq!(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
        // Without --virtual-local-rank torchrun never pins devices per worker.
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "3,1");
    }
}

#[test]
fn master_port_given() {
    let dir = TempDir::new("env_master_port");
    let port = crate::util::free_port();
    let out = Rdrun::new()
        .arg("--nproc-per-node=2")
        .arg(format!("--master-port={port}"))
        .arg("--no-python")
        .arg(worker("print_env"))
        .arg(dir.path())
        .run();
    out.assert_code(0);
    for lr in 0..2 {
        let env = parse_env0(&std::fs::read_to_string(dir.join(format!("env.{lr}.0"))).unwrap());
        assert_eq!(env["MASTER_PORT"], port.to_string(), "{out:?}");
    }
}

#[test]
fn local_rank_substitution() {
    let dir = TempDir::new("env_substitution");
    envs(
        &dir,
        3,
        Rdrun::new(),
        &[
            "--rank=${local_rank}",
            "$local_rank",
            "a$$b",
            "$local_rankx",
            "${other}",
        ],
    );
    for lr in 0..3 {
        let args = std::fs::read_to_string(dir.join(format!("args.{lr}.0"))).unwrap();
        let want = format!("--rank={lr}\n{lr}\na$$b\n$local_rankx\n${{other}}\n");
        assert_eq!(args, want, "rank {lr}");
    }
}

/// Issue 10: arguments that are not UTF-8 reach the workers byte for byte (they were replaced
/// with U+FFFD), `${local_rank}` next to such bytes included.
#[test]
fn script_arguments_pass_byte_for_byte() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let dir = TempDir::new("env_bytes");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node=2", "--no-python"])
        .arg(worker("print_env"))
        .arg(dir.path())
        .arg(OsString::from_vec(b"\xff\xfe-raw".to_vec()))
        .arg(OsString::from_vec(b"--x=\xe9${local_rank}\x80".to_vec()))
        .run();
    out.assert_code(0);
    for lr in 0..2u8 {
        let args = std::fs::read(dir.join(format!("args.{lr}.0"))).unwrap();
        let mut want = b"\xff\xfe-raw\n--x=\xe9".to_vec();
        want.push(b'0' + lr);
        want.extend_from_slice(b"\x80\n");
        assert_eq!(args, want, "rank {lr}: {out:?}");
    }
}

#[test]
fn virtual_local_rank() {
    // (parent CUDA_VISIBLE_DEVICES, what local ranks 0 and 1 get)
    for (parent, want) in [(Some("4,6"), ["4", "6"]), (None, ["0", "1"])] {
        let dir = TempDir::new("env_virtual");
        let mut rdrun = Rdrun::new().arg("--virtual-local-rank");
        if let Some(devices) = parent {
            rdrun = rdrun.env("CUDA_VISIBLE_DEVICES", devices);
        }
        let all = envs(&dir, 2, rdrun, &[]);
        for (lr, env) in all.iter().enumerate() {
            assert_eq!(env["LOCAL_RANK"], "0", "rank {lr}");
            assert_eq!(env["RANK"], lr.to_string());
            assert_eq!(
                env["CUDA_VISIBLE_DEVICES"], want[lr],
                "rank {lr}, parent {parent:?}"
            );
        }
    }
}

#[test]
fn each_worker_leads_its_own_session() {
    let dir = TempDir::new("env_session");
    let out = Rdrun::new()
        .arg("--nproc-per-node=2")
        .arg("--no-python")
        .arg(worker("print_env"))
        .arg(dir.path())
        .spawn();
    let rdrun_pid = out.pid;
    out.wait().assert_code(0);
    for lr in 0..2 {
        let stat = std::fs::read_to_string(dir.join(format!("stat.{lr}.0"))).unwrap();
        let (pid, rest) = stat.split_once(' ').unwrap();
        let fields: Vec<&str> = rest[rest.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .collect();
        // fields: state ppid pgrp session (proc(5)).
        assert_eq!(fields[1], rdrun_pid.to_string(), "parent of rank {lr}");
        assert_eq!(fields[2], pid, "process group of rank {lr}");
        assert_eq!(fields[3], pid, "session of rank {lr}");
    }
}

#[test]
fn virtual_local_rank_without_enough_devices() {
    let dir = TempDir::new("env_virtual_short");
    let out = Rdrun::new()
        .env("CUDA_VISIBLE_DEVICES", "3")
        .args(["--standalone", "--nproc-per-node=2", "--virtual-local-rank"])
        .arg("--no-python")
        .arg(worker("print_env"))
        .arg(dir.path())
        .run();
    out.assert_code(1);
    assert!(
        out.stderr.contains("CUDA_VISIBLE_DEVICES"),
        "the error must name the variable: {out:?}"
    );
}

#[test]
fn signals_to_handle_reaches_workers() {
    let dir = TempDir::new("env_signals");
    let all = envs(
        &dir,
        1,
        Rdrun::new().arg("--signals-to-handle=SIGTERM,SIGUSR1"),
        &[],
    );
    assert_eq!(all[0]["TORCHELASTIC_SIGNALS_TO_HANDLE"], "SIGTERM,SIGUSR1");
}

/// A fake Python environment `<dir>/venv` (bin/python), with a pip NCCL library when asked.
fn fake_venv(dir: &TempDir, with_nccl: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    let venv = dir.join("venv");
    let lib = venv.join("lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
    std::fs::create_dir_all(lib.parent().expect("parent")).expect("mkdir");
    if with_nccl {
        std::fs::write(&lib, b"not really a library").expect("write");
    }
    std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
    let python = venv.join("bin/python");
    std::fs::write(&python, b"#!/bin/sh\nexit 0\n").expect("write");
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    (venv, lib)
}

/// Issue #6: a pip-installed NCCL (`nvidia/nccl/lib/libnccl.so.2` in the worker's Python
/// environment) is made loadable for cudarc, which only tries `libnccl.so`: the workers'
/// LD_LIBRARY_PATH starts with a directory holding `libnccl.so -> …/libnccl.so.2`, and the
/// inherited value follows. Without a pip NCCL nothing changes.
#[test]
fn pip_nccl_made_loadable() {
    let dir = TempDir::new("pip_nccl");
    let (venv, lib) = fake_venv(&dir, true);
    let all = envs(
        &dir,
        2,
        Rdrun::new()
            .env("VIRTUAL_ENV", venv.to_str().expect("utf8"))
            .env("XDG_CACHE_HOME", dir.join("cache").to_str().expect("utf8"))
            .env("LD_LIBRARY_PATH", "/inherited/lib"),
        &[],
    );
    for env in &all {
        let path = &env["LD_LIBRARY_PATH"];
        let (first, rest) = path.split_once(':').expect("two entries");
        assert_eq!(rest, "/inherited/lib", "{path}");
        let link = std::path::Path::new(first).join("libnccl.so");
        assert_eq!(std::fs::read_link(&link).expect("symlink"), lib, "{path}");
    }

    let dir2 = TempDir::new("no_pip_nccl");
    let (venv2, _) = fake_venv(&dir2, false);
    let all = envs(
        &dir2,
        1,
        Rdrun::new()
            .env("VIRTUAL_ENV", venv2.to_str().expect("utf8"))
            .env("XDG_CACHE_HOME", dir2.join("cache").to_str().expect("utf8"))
            .env("LD_LIBRARY_PATH", "/inherited/lib"),
        &[],
    );
    assert_eq!(all[0]["LD_LIBRARY_PATH"], "/inherited/lib");
}

/// Issue #6: shared-memory segments a crashed worker left in /dev/shm for this run are removed
/// when the run ends; another run's segments are not touched.
#[test]
fn leftover_shm_segments_of_the_run_are_removed() {
    let shm = std::path::Path::new(rdrun::workerenv::SHM_DIR);
    if !shm.is_dir() {
        eprintln!("skipped: no {} on this machine", shm.display());
        return;
    }
    let run_id = format!("shmtest-{}", std::process::id());
    let other_id = format!("{run_id}-other");
    let ours = shm.join(format!(
        "{}0.leftover",
        rdrun::workerenv::run_shm_prefix(&run_id)
    ));
    let theirs = shm.join(format!(
        "{}0.leftover",
        rdrun::workerenv::run_shm_prefix(&other_id)
    ));
    std::fs::write(&ours, b"x").expect("write ours");
    std::fs::write(&theirs, b"x").expect("write theirs");
    let out = Rdrun::new()
        .args([
            "--nnodes=1",
            &format!("--master-port={}", crate::util::free_port()),
            &format!("--rdzv-id={run_id}"),
            "--no-python",
            "true",
        ])
        .run();
    let ours_left = ours.exists();
    let theirs_left = theirs.exists();
    let _ = std::fs::remove_file(&ours);
    let _ = std::fs::remove_file(&theirs);
    out.assert_code(0);
    assert!(!ours_left, "the run's leftover segment survived: {out:?}");
    assert!(theirs_left, "another run's segment was removed");
}

/// Issue 38.9: descriptors rdrun inherited beyond stdio (`exec 7</dev/null 9>/dev/null`
/// before it) reach no worker, cold or forked warm, and no health-check command: each sees fds
/// 0-2 only, what torchrun's `Popen(close_fds=True)` gives a worker. Before, they saw 7 and 9.
#[test]
fn workers_and_checks_get_stdio_and_no_inherited_descriptor() {
    use std::process::Command;
    // Lists the process's open descriptors without opening one (fcntl on each number), and
    // whether it was forked warm (the template preloaded the module; the script never imports
    // it). A worker writes `fds.<RANK>`, the health check `fds.check`.
    const FDS: &str = r#"
import fcntl, os, sys
def is_open(fd):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
        return True
    except OSError:
        return False
fds = [fd for fd in range(4096) if is_open(fd)]
warm = "xml.dom.minidom" in sys.modules
with open(os.path.join(sys.argv[1], "fds.%s" % os.environ.get("RANK", "check")), "w") as f:
    f.write("%s %s" % ("warm" if warm else "cold", ",".join(map(str, fds))))
"#;
    let dir = TempDir::new("env_fds");
    let script = dir.join("fds.py");
    std::fs::write(&script, FDS).unwrap();
    for warm in ["off", "on"] {
        let mut cmd = Command::new("sh");
        // The descriptors a shell leaves open to what it execs; then rdrun in its place.
        cmd.args(["-c", "exec 7</dev/null 9>/dev/null; exec \"$0\" \"$@\""])
            .arg(crate::util::rdrun_bin())
            .args(["--standalone", "--nproc-per-node=2", "--health-check=on"])
            .arg(format!("--warm-start={warm}"))
            .args(["--preload", "xml.dom.minidom"])
            .arg("--health-check-cmd")
            .arg(format!(
                "exec python3 {} {}",
                script.display(),
                dir.path().display()
            ))
            .arg(&script)
            .arg(dir.path())
            .env_remove("RDRUN_WARM_START")
            .env_remove("OMP_NUM_THREADS");
        let bound = std::time::Duration::from_secs(120);
        let out = crate::util::output_with_stdin(&mut cmd, b"", bound);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "--warm-start={warm}: {stderr}");
        let mode = if warm == "on" { "warm" } else { "cold" };
        for (who, want) in [("0", mode), ("1", mode), ("check", "cold")] {
            let seen = std::fs::read_to_string(dir.join(format!("fds.{who}")))
                .unwrap_or_else(|e| panic!("{who} wrote nothing ({e}): {stderr}"));
            assert_eq!(
                seen,
                format!("{want} 0,1,2"),
                "{who}, --warm-start={warm}: {stderr}"
            );
        }
    }
}
