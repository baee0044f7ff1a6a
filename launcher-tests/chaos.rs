//! Chaos mode (issue 41) with real processes: `--chaos` injects a kill or a hang into a running
//! job, the job restarts (a gloo DDP job resumes from its checkpoint), and the end's table,
//! `--report-json`'s `chaos` section and the `chaos_inject` / `chaos_recovered` events say what
//! was measured; injected failures never reach the stop verdict; a fault the job does not
//! survive fails the run with one line naming it; the seeded schedule is the same twice; a
//! slow rank; a lost node survived by the others (c10d on two namespace nodes; etcd on three,
//! the store host lost).

use std::path::Path;
use std::time::Duration;

use crate::util::{torch_python, Rdrun, TempDir};

/// A gloo DDP job of `steps` steps (0.1 s each) that prints `step N` on every rank and, with
/// `ckpt`, saves a checkpoint every 5 steps (rank 0, atomically) and resumes from it.
const DDP_JOB: &str = r#"
import os, sys, time
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
out, steps, ckpt_on = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "ckpt"
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = os.path.join(out, "ckpt.pt")
start = 0
if ckpt_on and os.path.exists(ckpt):
    state = torch.load(ckpt, map_location="cpu")
    model.module.load_state_dict(state["model"])
    start = state["step"] + 1
    print(f"resumed from step {state['step']}", flush=True)
for step in range(start, steps):
    opt.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()
    print(f"step {step}", flush=True)
    if ckpt_on and rank == 0 and step % 5 == 4:
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"#;

/// A shell job of `$2` steps of 0.1 s on every rank (no checkpoint: each attempt starts at 0).
const SHELL_JOB: &str =
    "i=0; while [ $i -lt $1 ]; do echo \"step $i\"; i=$((i+1)); sleep 0.1; done\n";

fn shell_job(dir: &TempDir, nproc: usize) -> Rdrun {
    let script = dir.join("job.sh");
    std::fs::write(&script, SHELL_JOB).unwrap();
    Rdrun::new()
        .arg("--standalone")
        .arg("--no-python")
        .arg(format!("--nproc-per-node={nproc}"))
        .arg("--report-json")
        .arg(dir.join("report.json"))
        .arg("--events")
        .arg(dir.join("events.jsonl"))
        .timeout(Duration::from_secs(120))
}

fn report(dir: &TempDir) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("report");
    serde_json::from_str(&text).expect("json")
}

fn events(path: &Path, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == name)
        .collect()
}

/// The table's row of `kind`: its whitespace-separated cells.
fn row<'a>(stderr: &'a str, kind: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .find(|l| l.starts_with(&format!("{kind} ")))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default()
}

/// Issue 41: a real gloo DDP job with checkpoints, one injected kill: one restart, resumed from
/// the checkpoint (the work lost is a few steps, not the run), a table of one row, the report's
/// section, the events, the restart's cause labelled injected.
#[test]
fn a_kill_restarts_the_ddp_job_which_resumes_from_its_checkpoint() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("chaos_kill");
    let script = dir.join("ddp.py");
    std::fs::write(&script, DDP_JOB).unwrap();
    let out = Rdrun::new()
        .arg("--standalone")
        .arg("--nproc-per-node=2")
        .arg("--max-restarts=1")
        .arg("--chaos")
        .arg("kill:after=10s,rank=1")
        .arg("--chaos-progress")
        .arg(r"^step (\d+)")
        .arg("--report-json")
        .arg(dir.join("report.json"))
        .arg("--events")
        .arg(dir.join("events.jsonl"))
        .env("PYTHON_EXEC", &python)
        .timeout(Duration::from_secs(240))
        .arg(&script)
        .arg(dir.path())
        .arg("200")
        .arg("ckpt")
        .run();
    out.assert_code(0);
    assert!(
        out.stderr.contains("chaos mode: 1 fault spec(s), seed "),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("chaos fault 1: kill rank=1 after=10s; gaps +10.000s"),
        "{out:?}"
    );
    assert!(out.stdout.contains("resumed from step"), "resumed: {out:?}");
    let cells = row(&out.stderr, "kill");
    assert_eq!(
        cells.get(1..3),
        Some(&["1", "1"][..]),
        "one injected, survived: {out:?}"
    );
    let v = report(&dir);
    let fault = &v["chaos"]["faults"][0];
    assert_eq!(fault["kind"], "kill", "{v}");
    assert_eq!(fault["rank"], 1, "{v}");
    assert_eq!(fault["state"], "recovered", "{v}");
    let before = fault["progress_before"].as_f64().expect("a step before");
    let after = fault["progress_after"].as_f64().expect("a step after");
    // Resumed from its last checkpoint (every 5 steps), not from 0; the value before is what
    // the output showed at the fault (a line may still be on its way).
    assert!(
        after > 0.0 && after <= before + 2.0,
        "resumed, not from 0: {fault}"
    );
    let lost = fault["work_lost"].as_f64().expect("work lost");
    assert!(lost <= 6.0, "at most a checkpoint interval lost: {fault}");
    for key in ["detect_s", "recover_s", "progress_s"] {
        assert!(
            fault[key].as_f64().is_some_and(|s| s >= 0.0),
            "{key}: {fault}"
        );
    }
    assert!(
        fault["recover_s"].as_f64() >= fault["detect_s"].as_f64(),
        "{fault}"
    );
    assert_eq!(v["chaos"]["summary"]["kill"]["injected"], 1, "{v}");
    assert_eq!(v["chaos"]["survived"], true, "{v}");
    let cause = v["restarts"][0]["cause"].as_str().unwrap_or_default();
    assert!(
        cause.starts_with("injected kill rank 1, chaos fault 1"),
        "{v}"
    );
    let ev = dir.join("events.jsonl");
    assert_eq!(events(&ev, "chaos_inject").len(), 1);
    let rec = events(&ev, "chaos_recovered");
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0]["fault"], 1);
}

/// Issue 41: `hang` stops a rank (SIGSTOP); the hang detector finds the job quiet, the group is
/// stopped (the stopped rank continued first, none left stopped) and restarted.
#[test]
fn a_hang_is_found_by_the_hang_detector_and_restarted() {
    let Some(python) = torch_python() else {
        return;
    };
    let dir = TempDir::new("chaos_hang");
    let script = dir.join("ddp.py");
    std::fs::write(&script, DDP_JOB).unwrap();
    let out = Rdrun::new()
        .arg("--standalone")
        .arg("--nproc-per-node=2")
        .arg("--max-restarts=1")
        .args([
            "--hang-detect",
            "kill",
            "--hang-timeout",
            "3s",
            "--hang-poll-interval",
            "0.5s",
        ])
        .args(["--chaos", "hang:after=10s,rank=0"])
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .arg("--report-json")
        .arg(dir.join("report.json"))
        .env("PYTHON_EXEC", &python)
        .timeout(Duration::from_secs(240))
        .arg(&script)
        .arg(dir.path())
        .arg("200")
        .arg("ckpt")
        .run();
    out.assert_code(0);
    let v = report(&dir);
    hang_recovered(&v, 3.0, &out);
    let cause = v["restarts"][0]["cause"].as_str().unwrap_or_default();
    assert!(
        cause.contains("injected hang rank 0") && cause.contains("hang"),
        "{v}"
    );
}

/// A one-rank job has no other rank whose wait shows the hang, and the detector exempts a
/// stopped rank (a debugger's pause): the rank rdrun stopped itself is watched all the same, so
/// the hang is found, the job restarts and the fault is survived (it used to wait forever).
#[test]
fn a_hang_of_the_only_rank_is_found_too() {
    let dir = TempDir::new("chaos_hang_one");
    let out = shell_job(&dir, 1)
        .arg("--max-restarts=1")
        .args(["--hang-detect", "kill", "--hang-timeout", "2s"])
        .args(["--hang-poll-interval", "0.5s"])
        .args(["--chaos", "hang:after=1s,count=1"])
        .arg("sh")
        .arg(dir.join("job.sh"))
        .arg("40")
        .run();
    out.assert_code(0);
    hang_recovered(&report(&dir), 2.0, &out);
}

/// Issue 41: injected failures are no failures of the job: five kills of the same rank with
/// `--max-same-failures 2` are five restarts, not a stop verdict (exit 93).
#[test]
fn five_injected_kills_never_reach_the_stop_verdict() {
    let dir = TempDir::new("chaos_five");
    let out = shell_job(&dir, 2)
        .args(["--max-restarts=5", "--max-same-failures=2"])
        .args(["--chaos", "kill:after=0.5s,every=0.3s,count=5,rank=0"])
        .arg("sh")
        .arg(dir.join("job.sh"))
        .arg("25")
        .run();
    out.assert_code(0);
    let cells = row(&out.stderr, "kill");
    assert_eq!(cells.get(1..3), Some(&["5", "5"][..]), "{out:?}");
    let v = report(&dir);
    assert_eq!(v["restarts"].as_array().map(Vec::len), Some(5), "{v}");
    assert_eq!(v["chaos"]["summary"]["kill"]["survived"], 5, "{v}");
    let ev = dir.join("events.jsonl");
    assert_eq!(events(&ev, "chaos_inject").len(), 5);
    assert_eq!(events(&ev, "chaos_recovered").len(), 5);
}

/// Issue 41: a job without checkpoints restarts from step 0 (the work lost is all of it), and a
/// kill with no restart left is a fault not survived: exit ≠ 0 and one line naming it.
#[test]
fn work_restarted_from_zero_is_lost_and_a_fault_not_survived_fails_the_run() {
    let dir = TempDir::new("chaos_lost");
    let out = shell_job(&dir, 2)
        .args(["--max-restarts=1", "--chaos", "kill:after=1.5s,rank=1"])
        .args(["--chaos-progress", r"step (\d+)"])
        .arg("sh")
        .arg(dir.join("job.sh"))
        .arg("30")
        .run();
    out.assert_code(0);
    let fault = report(&dir)["chaos"]["faults"][0].clone();
    let before = fault["progress_before"].as_f64().expect("before");
    assert!(before >= 5.0, "{fault}");
    assert_eq!(fault["progress_after"].as_f64(), Some(0.0), "{fault}");
    assert_eq!(fault["work_lost"].as_f64(), Some(before), "{fault}");

    let dir = TempDir::new("chaos_not_survived");
    let out = shell_job(&dir, 2)
        .args(["--max-restarts=0", "--chaos", "kill:after=1s,rank=1"])
        .arg("sh")
        .arg(dir.join("job.sh"))
        .arg("50")
        .run();
    assert_ne!(out.code, Some(0), "{out:?}");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("was not survived"))
        .collect();
    assert_eq!(
        lines,
        vec!["chaos: fault 1 (kill rank 1 in attempt 0) was not survived: the job ended without coming back to user code"],
        "{out:?}"
    );
    assert_eq!(report(&dir)["chaos"]["survived"], false);
}

/// Issue 41: `mtbf` with a seed is the same schedule twice (printed at start); another seed is
/// another schedule; a bad spec is one line before anything starts.
#[test]
fn the_seeded_schedule_is_the_same_twice_and_a_bad_spec_is_refused() {
    let dir = TempDir::new("chaos_seed");
    let schedule = |seed: u32| {
        let out = shell_job(&dir, 1)
            .args(["--chaos", &format!("kill:mtbf=30s,seed={seed}")])
            .env("RDRUN_CHAOS", "hang:mtbf=1m")
            .args(["--hang-detect", "kill"])
            .arg("true")
            .run();
        out.assert_code(0);
        out.stderr
            .lines()
            .filter(|l| l.contains("chaos fault "))
            .map(|l| l.split_once("chaos fault ").unwrap().1.to_string())
            .collect::<Vec<_>>()
    };
    let (a, b, c) = (schedule(7), schedule(7), schedule(8));
    assert_eq!(a.len(), 1, "the flag wins over RDRUN_CHAOS: {a:?}");
    assert!(
        a[0].starts_with("1: kill rank=random mtbf=30s; gaps +"),
        "{a:?}"
    );
    assert_eq!(a, b);
    assert_ne!(a, c);

    let out = shell_job(&dir, 1)
        .args(["--chaos", "kill:after=1s", "--chaos", "explode:after=1s"])
        .arg("true")
        .run();
    // A usage error (exit 2), as every bad flag value, refused before anything starts.
    out.assert_code(2);
    assert!(
        out.stderr
            .contains("--chaos \"explode:after=1s\": unknown fault \"explode\""),
        "{out:?}"
    );
    for (args, says) in [
        (
            &["--chaos-progress", "step (\\d+)"][..],
            "--chaos-progress needs --chaos",
        ),
        (
            &["--chaos", "kill:after=1s", "--chaos-progress", "step ("][..],
            "--chaos-progress \"step (\": not a regular expression",
        ),
        (
            &["--chaos", "hang:after=1s", "--hang-detect", "observe"][..],
            "a hang is only found and stopped with --hang-detect kill",
        ),
        (
            &["--chaos", "node-loss:after=1s"][..],
            "node-loss needs a multi-node rendezvous",
        ),
    ] {
        let out = shell_job(&dir, 1).args(args).arg("true").run();
        out.assert_code(2);
        assert!(out.stderr.contains(says), "{args:?}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "one line: {out:?}");
    }
}

/// Issue 41: `node-loss` on two namespace nodes (c10d, `--nnodes 1:2`): the chosen node's agent
/// kills its workers and itself (SIGKILL, as a dead machine); the other node detects the lost
/// peer, regroups alone and finishes, its regroup measured in its report. Only the victim runs
/// `--chaos`, with one spec per possible group rank (whichever it gets, one lands on it).
#[test]
fn node_loss_is_survived_by_the_other_node_which_regroups() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("chaos_node_loss");
        let endpoint = format!("{}:29400", net.addr(0));
        let agent = |i: usize| {
            Rdrun::new()
                .timeout(Duration::from_secs(120))
                .args([
                    "--nnodes",
                    "1:2",
                    "--rdzv-backend",
                    "c10d",
                    "--rdzv-endpoint",
                ])
                .arg(&endpoint)
                .args([
                    "--rdzv-id",
                    "chaosjob",
                    "--rdzv-conf",
                    "last_call_timeout=20",
                ])
                .arg("--report-json")
                .arg(dir.join(format!("report{i}.json")))
                .netns(&net.name(i))
                .env("MN_HOLD_GWS", "2")
        };
        let survivor = agent(0)
            .arg("--no-python")
            .arg(crate::util::worker("mn_worker"))
            .arg(dir.path())
            .spawn();
        let victim = agent(1)
            .args([
                "--chaos",
                "node-loss:after=2s,node=0",
                "--chaos",
                "node-loss:after=2s,node=1",
            ])
            .arg("--no-python")
            .arg(crate::util::worker("mn_worker"))
            .arg(dir.path())
            .spawn();
        let dead = victim.wait();
        assert_eq!(dead.signal, Some(libc::SIGKILL), "{dead:?}");
        assert!(
            dead.stderr
                .contains("chaos: injecting fault 1 (node-loss node "),
            "{dead:?}"
        );
        let out = survivor.wait();
        out.assert_code(0);
        let recs = crate::multinode::records(dir.path());
        assert!(
            recs.keys().any(|k| k.0 == 1),
            "the survivor regrouped alone: {recs:#?}"
        );
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("report0.json")).expect("report"),
        )
        .expect("json");
        let regroup = &v["restarts"][0];
        assert!(
            regroup["seconds"]["total_s"].as_f64().is_some(),
            "regroup measured: {v}"
        );
        crate::util::assert_no_leak(
            &crate::multinode::recorded_pids(dir.path()),
            Duration::from_secs(10),
        );
    });
}

/// Issue 41: `slow` throttles one rank for a while (a duty cycle of SIGSTOP/SIGCONT: the run's
/// cgroup cannot give one of its members a quota of its own); the job goes on through it, and
/// the fault is in the table and the report, survived. What the rank lived through is counted
/// by the rank itself, not timed (a busy machine slows every rank alike): each continue after
/// a stop runs its SIGCONT trap, and only rank 1 is ever stopped.
#[test]
fn a_slow_rank_is_throttled_for_a_while_and_reported() {
    let dir = TempDir::new("chaos_slow");
    let script = dir.join("busy.sh");
    std::fs::write(
        &script,
        "c=0; trap 'c=$((c+1))' CONT; n=0; while [ $n -lt $1 ]; do n=$((n+1)); done\n\
         echo $c > \"$2/continued.$RANK\"\n",
    )
    .unwrap();
    let out = shell_job(&dir, 2)
        .args(["--chaos", "slow:after=0.2s,rank=1,for=2s,cpu=10"])
        .arg("sh")
        .arg(&script)
        .arg("4000000")
        .arg(dir.path())
        .run();
    out.assert_code(0);
    let continued = |r: usize| -> u64 {
        let text = std::fs::read_to_string(dir.join(format!("continued.{r}"))).expect("count");
        text.trim().parse().expect("a count")
    };
    assert_eq!(continued(0), 0, "rank 0 is never stopped: {out:?}");
    assert!(
        continued(1) >= 1,
        "rank 1 was stopped and continued: {out:?}"
    );
    let cells = row(&out.stderr, "slow");
    assert_eq!(cells.get(1..3), Some(&["1", "1"][..]), "{out:?}");
    let fault = report(&dir)["chaos"]["faults"][0].clone();
    assert_eq!(
        (fault["kind"].as_str(), fault["rank"].as_u64()),
        (Some("slow"), Some(1)),
        "{fault}"
    );
    assert_eq!(fault["state"], "recovered", "{fault}");
}

/// Issue 41: `node-loss` on three etcd nodes, the store host the victim: every node runs the
/// same `--chaos` (the same seed, so the same draw), the node of group rank 0 — the one that
/// hosts the workers' store — ends itself; the other two regroup with a new store host and
/// finish, the regroup measured in their reports.
#[cfg(feature = "etcd")]
#[test]
fn node_loss_of_the_etcd_store_host_is_survived_by_the_others() {
    crate::netns::bounded(Duration::from_secs(300), || {
        let Some(tb) = crate::etcd::Testbed::new(3, 1) else {
            return;
        };
        let dir = TempDir::new("chaos_etcd_loss");
        let running: Vec<_> = (0..3)
            .map(|i| {
                let r = Rdrun::new()
                    .timeout(Duration::from_secs(150))
                    .args([
                        "--nnodes",
                        "2:3",
                        "--rdzv-backend",
                        "etcd-v3",
                        "--rdzv-endpoint",
                    ])
                    .arg(tb.endpoints())
                    .args([
                        "--rdzv-id",
                        "chaosetcd",
                        "--rdzv-conf",
                        "last_call_timeout=20",
                    ])
                    .args(["--chaos", "node-loss:after=3s,node=0,seed=5"])
                    .arg("--report-json")
                    .arg(dir.join(format!("report{i}.json")))
                    .env("MN_HOLD_GWS", "3");
                let r = match &tb.net {
                    Some(net) => r.netns(&net.name(i)),
                    None => r.args(["--local-addr".to_string(), tb.addr(i)]),
                };
                r.arg("--no-python")
                    .arg(crate::util::worker("mn_worker"))
                    .arg(dir.path())
                    .spawn()
            })
            .collect();
        let outs: Vec<crate::util::Output> = running.into_iter().map(|r| r.wait()).collect();
        let victims: Vec<usize> = (0..3)
            .filter(|&i| outs[i].signal == Some(libc::SIGKILL))
            .collect();
        assert_eq!(victims.len(), 1, "one node lost: {outs:?}");
        let v = victims[0];
        assert!(
            outs[v]
                .stderr
                .contains("chaos: injecting fault 1 (node-loss node 0"),
            "{:?}",
            outs[v]
        );
        let recs = crate::multinode::records(dir.path());
        let (master, _) = crate::multinode::check_round(&recs, 2, 0, Some(&[1, 1]));
        assert_ne!(master, tb.addr(v), "a new store host: {recs:#?}");
        for i in (0..3).filter(|&i| i != v) {
            outs[i].assert_code(0);
            let rep: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(format!("report{i}.json"))).expect("report"),
            )
            .expect("json");
            assert!(
                rep["restarts"][0]["seconds"]["total_s"].as_f64().is_some(),
                "node {i}'s regroup measured: {rep}"
            );
        }
        crate::util::assert_no_leak(
            &crate::multinode::recorded_pids(dir.path()),
            Duration::from_secs(10),
        );
    });
}

/// Issue 41 on two c10d nodes (loopback), a gloo DDP job of one rank per node: every node runs
/// the same `--chaos` (one seed, one draw); the node that holds rank 1 kills it twice, the other
/// node's rank then fails in its collective and that node learns from the injecting node's
/// root-cause entry (or its own draw of the same schedule) that the fault was injected; on both, every restart is labelled injected and none reaches the stop
/// verdict (`--max-same-failures 2`): both finish.
#[test]
fn injected_kills_on_a_two_node_job_are_labelled_on_both_nodes() {
    let Some(python) = torch_python() else {
        return;
    };
    crate::netns::bounded(Duration::from_secs(300), move || {
        let dir = TempDir::new("chaos_c10d_kills");
        std::fs::write(dir.join("ddp.py"), DDP_JOB).unwrap();
        let port = crate::util::free_port();
        let running: Vec<_> = (1..=2)
            .map(|h| {
                let agent = Rdrun::new()
                    .timeout(Duration::from_secs(240))
                    .env("PYTHON_EXEC", &python)
                    .args([
                        "--nnodes",
                        "2",
                        "--nproc-per-node",
                        "1",
                        "--rdzv-backend",
                        "c10d",
                    ])
                    .arg("--rdzv-endpoint")
                    .arg(format!("127.0.0.1:{port}"))
                    .args(["--rdzv-id", "chaoskills", "--rdzv-conf"])
                    .arg(format!("last_call_timeout=5,is_host={}", h == 1))
                    .arg("--local-addr")
                    .arg(format!("127.0.0.{h}"))
                    .args(["--max-restarts=2", "--max-same-failures=2"])
                    .args(["--chaos", "kill:after=6s,every=4s,count=2,rank=1,seed=3"]);
                ddp_job(agent, &dir, &format!("report{h}.json"), "150").spawn()
            })
            .collect();
        let outs: Vec<crate::util::Output> = running.into_iter().map(|r| r.wait()).collect();
        let mut injecting = 0;
        for (i, out) in outs.iter().enumerate() {
            out.assert_code(0);
            let v = report_at(&dir.join(format!("report{}.json", i + 1)));
            let restarts = v["restarts"].as_array().cloned().unwrap_or_default();
            assert_eq!(restarts.len(), 2, "{v}\n{out:?}");
            for r in &restarts {
                let cause = r["cause"].as_str().unwrap_or_default();
                assert!(cause.starts_with("injected kill"), "{v}");
            }
            if v["chaos"]["summary"]["kill"]["injected"] == 2 {
                injecting += 1;
            }
        }
        assert_eq!(injecting, 1, "one node injects and measures: {outs:?}");
    });
}

/// The label travels with the root-cause exchange, not with each node's clock: node 0's spec
/// is the same fault an hour later, so its own clock never draws it, and only node 1's entry
/// can tell it that the attempt ended by an injected kill. Both nodes name the same fault, and
/// node 0 does not count it (`--max-same-failures 1` would stop a job that counted it).
/// Static rendezvous: node 1 holds rank 1, whatever the timing.
#[test]
fn a_kill_on_one_node_is_labelled_on_the_other_by_the_exchange_alone() {
    let Some(python) = torch_python() else {
        return;
    };
    crate::netns::bounded(Duration::from_secs(300), move || {
        let dir = TempDir::new("chaos_static_label");
        std::fs::write(dir.join("ddp.py"), DDP_JOB).unwrap();
        let port = crate::util::free_port();
        let running: Vec<_> = [("0", "1h"), ("1", "5s")]
            .into_iter()
            .map(|(node, after)| {
                let agent = Rdrun::new()
                    .timeout(Duration::from_secs(240))
                    .env("PYTHON_EXEC", &python)
                    .args(["--nnodes", "2", "--node-rank", node])
                    .args(["--nproc-per-node", "1", "--master-addr", "127.0.0.1"])
                    .arg("--master-port")
                    .arg(port.to_string())
                    .args(["--max-restarts=1", "--max-same-failures=1"])
                    .arg("--chaos")
                    .arg(format!("kill:after={after},count=1,rank=1,seed=3"));
                ddp_job(agent, &dir, &format!("report{node}.json"), "100").spawn()
            })
            .collect();
        let outs: Vec<crate::util::Output> = running.into_iter().map(|r| r.wait()).collect();
        let mut causes = Vec::new();
        for (node, out) in outs.iter().enumerate() {
            out.assert_code(0);
            let v = report_at(&dir.join(format!("report{node}.json")));
            let restarts = v["restarts"].as_array().cloned().unwrap_or_default();
            assert_eq!(restarts.len(), 1, "node {node}: {v}\n{out:?}");
            let cause = restarts[0]["cause"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let label = cause.split(':').next().unwrap_or_default().to_string();
            causes.push(label);
            let injected = v["chaos"]["summary"]["kill"]["injected"]
                .as_u64()
                .unwrap_or(0);
            assert_eq!(injected, node as u64, "node 1 injects and measures: {v}");
        }
        assert_eq!(
            causes, ["injected kill rank 1, chaos fault 1"; 2],
            "both nodes name node 1's fault: {outs:?}"
        );
    });
}

/// The report's first fault is a hang, survived, detected no sooner than `budget` seconds.
fn hang_recovered(v: &serde_json::Value, budget: f64, out: &crate::util::Output) {
    let fault = &v["chaos"]["faults"][0];
    assert_eq!(
        (fault["kind"].as_str(), fault["state"].as_str()),
        (Some("hang"), Some("recovered")),
        "{v}\n{out:?}"
    );
    let detect = fault["detect_s"].as_f64().expect("detected");
    assert!(detect >= budget, "not before the hang budget: {fault}");
}

/// `agent` (its options given) running [`DDP_JOB`] (written to `dir/ddp.py`) for `steps`
/// steps with checkpoints, its `--report-json` at `dir/report`.
fn ddp_job(agent: Rdrun, dir: &TempDir, report: &str, steps: &str) -> Rdrun {
    agent
        .arg("--report-json")
        .arg(dir.join(report))
        .arg(dir.join("ddp.py"))
        .arg(dir.path())
        .arg(steps)
        .arg("ckpt")
}

/// The `--report-json` document at `path`.
fn report_at(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("report");
    serde_json::from_str(&text).expect("json")
}
