//! The `train` demo as separate processes: equal final loss for 1, 2 and 4 workers, restart
//! from a checkpoint, and a crashed rank making the others fail fast instead of hanging.

use std::process::Command;
use std::time::Duration;

use crate::runtime::{spawn_ranks, spawn_ranks_store, TempDir};

fn train() -> &'static str {
    env!("CARGO_BIN_EXE_train")
}

fn final_loss(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("final loss "))
        .unwrap_or_else(|| panic!("no final loss in {stdout:?}"))
        .trim()
        .parse()
        .expect("loss is a number")
}

const ARGS: [&str; 4] = ["--epochs", "3", "--samples", "1024"];

fn single() -> f64 {
    let out = Command::new(train())
        .args(ARGS)
        .env_remove("RANK")
        .output()
        .expect("run train");
    assert!(out.status.success(), "{out:?}");
    final_loss(&String::from_utf8_lossy(&out.stdout))
}

/// Same global batch on every world size: the data-parallel runs follow the 1-worker path up to
/// float rounding of the gradient sums. Tolerance: 1e-4 relative on the final full-data loss.
#[test]
fn same_final_loss_for_1_2_4_workers() {
    let base = single();
    for (n, backend) in [(2usize, "shm"), (4, "shm"), (2, "tcp"), (4, "tcp")] {
        let dir = TempDir::new("train");
        let run = format!("train-{n}-{backend}-{}", std::process::id());
        let mut args = ARGS.to_vec();
        args.extend(["--backend", backend]);
        let res =
            spawn_ranks(train(), n, &args, &[], &run, 0, &dir.0).wait(0, Duration::from_secs(180));
        for (r, rr) in res.iter().enumerate() {
            assert!(rr.status.success(), "n={n} {backend} rank {r}: {rr:?}");
        }
        let out = &res[0].stdout;
        assert!(
            out.contains(&format!("params identical on {n} ranks")),
            "{out}"
        );
        assert!(out.contains(&format!("backend {backend}")), "{out}");
        assert_eq!(
            out.matches("loss ").count(),
            3 + 1 + 1,
            "3 epochs + start + final: {out}"
        );
        let l = final_loss(out);
        assert!(
            (l - base).abs() <= 1e-4 * base.abs(),
            "n={n} {backend}: {l} vs single worker {base}"
        );
    }
}

/// Rank 1 dies at the start of epoch 3: rank 0 fails within the bound naming the peer; the
/// restarted round resumes after epoch 2 and ends exactly where an uninterrupted run ends.
#[test]
fn crash_then_resume_from_checkpoint() {
    let base = single();
    for backend in ["tcp", "shm"] {
        let dir = TempDir::new("ckpt");
        let ck = dir.0.join("ckpt");
        let run = format!("ckpt-{backend}-{}", std::process::id());
        let ckpt = ck.to_string_lossy().into_owned();
        let mut args = ARGS.to_vec();
        args.extend([
            "--backend",
            backend,
            "--checkpoint-dir",
            &ckpt,
            "--fail-at-epoch",
            "3",
            "--fail-rank",
            "1",
        ]);
        let res =
            spawn_ranks(train(), 2, &args, &[], &run, 0, &dir.0).wait(0, Duration::from_secs(120));
        assert_eq!(res[1].status.code(), Some(1), "{:?}", res[1]);
        assert!(res[1].stderr.contains("injected failure at epoch 3"));
        assert!(
            !res[0].status.success(),
            "rank 0 must not succeed: {:?}",
            res[0]
        );
        assert!(
            res[0].stderr.contains("peer rank 1") || res[0].stderr.contains("timed out"),
            "{:?}",
            res[0].stderr
        );
        assert!(res[0].took < Duration::from_secs(60), "{:?}", res[0].took);
        assert!(ck.join("train.ckpt").is_file());
        let res =
            spawn_ranks(train(), 2, &args, &[], &run, 1, &dir.0).wait(1, Duration::from_secs(120));
        for rr in &res {
            assert!(rr.status.success(), "{rr:?}");
        }
        let out = &res[0].stdout;
        assert!(
            out.contains("resumed from checkpoint after epoch 2"),
            "{out}"
        );
        assert!(!out.contains("epoch 2/3"), "{out}");
        assert!(out.contains("epoch 3/3"), "{out}");
        let l = final_loss(out);
        assert!((l - base).abs() <= 1e-4 * base.abs(), "{l} vs {base}");
        let left: Vec<_> = std::fs::read_dir(&ck)
            .expect("ckpt dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("train.ckpt")],
            "no temp files"
        );
    }
}

#[test]
fn bad_flags_are_one_line_errors() {
    let out = Command::new(train())
        .args(["--batch-size", "3"])
        .env_remove("RANK")
        .output()
        .expect("run");
    // World 1 accepts any batch size; an unknown backend is the error here.
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(train())
        .args(["--backend", "carrier-pigeon"])
        .env_remove("RANK")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("unknown backend"), "{err}");
}

/// `rdrun --nproc_per_node=4 train` without the launcher: four processes joining through the
/// TCP store with the launcher's environment contract, default flags.
#[test]
fn four_workers_through_the_tcp_store() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = rt.block_on(async {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        rdrun::store::server::StoreServer::start(l, rdrun::store::server::ServerConfig::default())
            .expect("start store")
    });
    let dir = TempDir::new("train-store");
    let run = format!("train-store-{}", std::process::id());
    let res = spawn_ranks_store(train(), 4, &[], &[], &run, 0, &dir.0, Some(server.port()))
        .wait(0, Duration::from_secs(180));
    for (r, rr) in res.iter().enumerate() {
        assert!(rr.status.success(), "rank {r}: {rr:?}");
    }
    let out = &res[0].stdout;
    assert!(out.contains("train: world 4, backend shm"), "{out}");
    assert_eq!(out.matches("epoch ").count(), 5, "{out}");
    assert!(out.contains("params identical on 4 ranks"), "{out}");
    assert!(
        res[1].stdout.is_empty(),
        "only rank 0 prints: {:?}",
        res[1].stdout
    );
    rt.block_on(server.shutdown());
}

/// The README's command, `rdrun --nproc_per_node=4 train`, through the real launcher (its store,
/// environment contract and output): same final loss as one worker, identical parameters, only
/// rank 0 prints, no shared-memory segment left behind.
#[test]
fn under_rdrun_four_workers() {
    let base = single();
    let dir = crate::util::TempDir::new("rdrun-train");
    let run = format!("rdrun-train-{}", std::process::id());
    let out = crate::util::Rdrun::new()
        .current_dir(dir.path())
        .arg("--nproc_per_node=4")
        .arg(format!("--rdzv-id={run}"))
        .arg(train())
        .args(ARGS)
        .timeout(Duration::from_secs(180))
        .run();
    out.assert_code(0);
    assert!(
        out.stdout.contains("train: world 4, backend shm"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("params identical on 4 ranks"),
        "{out:?}"
    );
    assert_eq!(out.stdout.matches("epoch ").count(), 3, "{out:?}");
    let l = final_loss(&out.stdout);
    assert!((l - base).abs() <= 1e-4 * base.abs(), "{l} vs {base}");
    assert!(crate::runtime::shm_leftovers(&run).is_empty());
}

/// Under rdrun with `--max-restarts=1`: rank 1 dies at epoch 3, rdrun restarts the group, every
/// rank resumes from rank 0's last checkpoint and the run ends where an uninterrupted one ends.
#[test]
fn under_rdrun_restart_resumes_from_checkpoint() {
    let base = single();
    let dir = crate::util::TempDir::new("rdrun-restart");
    let ck = dir.join("ckpt");
    let out = crate::util::Rdrun::new()
        .current_dir(dir.path())
        .args(["--nproc_per_node=2", "--max-restarts=1"])
        .arg(train())
        .args(ARGS)
        .arg("--checkpoint-dir")
        .arg(&ck)
        .args(["--fail-at-epoch", "3", "--fail-rank", "1"])
        .timeout(Duration::from_secs(180))
        .run();
    out.assert_code(0);
    assert!(
        out.stderr.contains("injected failure at epoch 3"),
        "{out:?}"
    );
    // Rank 0 may be stopped by rdrun before it saves epoch 2, so the resume point is 1 or 2.
    assert!(
        out.stdout.contains("resumed from checkpoint after epoch 2")
            || out.stdout.contains("resumed from checkpoint after epoch 1"),
        "{out:?}"
    );
    let l = final_loss(&out.stdout);
    assert!((l - base).abs() <= 1e-4 * base.abs(), "{l} vs {base}");
}
