//! Scheduler environments as a user meets them (issue 25, items 1–6): the real `rdrun` binary
//! with the exact variables a scheduler sets, on loopback, no real scheduler. Dry runs start
//! nothing; the MPI case runs its two workers (`workers/mn_worker`).

use std::time::Duration;

use crate::cluster::slurm_step_env;
use crate::multinode::{get, records};
use crate::util::{worker, Output, Rdrun, TempDir};

const RUN: Duration = Duration::from_secs(120);

/// rdrun with exactly `env` beside PATH and HOME (as `env -i PATH=$PATH ...`), then `args`.
fn clean(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut r = Rdrun::new().timeout(RUN);
    for (k, _) in std::env::vars_os() {
        if k != "PATH" && k != "HOME" {
            r = r.env_remove(k);
        }
    }
    for (k, v) in env {
        r = r.env(k, v);
    }
    r.args(args).run()
}

fn script(dir: &TempDir) -> String {
    let p = dir.join("x.py");
    std::fs::write(&p, "print('x')\n").expect("script");
    p.display().to_string()
}

fn line_of<'a>(out: &'a str, name: &str) -> &'a str {
    let head = format!("rdrun:   {name:<16} ");
    out.lines()
        .find(|l| l.starts_with(&head))
        .unwrap_or_else(|| panic!("no {name} line in:\n{out}"))
}

/// 25.1: `PET_STANDALONE=""` as PyTorchJob sets it was a usage error (exit 2) before the
/// cluster reader, which accepts it, ever ran.
#[test]
fn pet_standalone_empty_as_pytorchjob_sets_it_is_on() {
    let dir = TempDir::new("se_pet_standalone");
    let x = script(&dir);
    let out = clean(
        &[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("PET_STANDALONE", ""),
            ("PET_NPROC_PER_NODE", "2"),
        ],
        &["--dry-run", &x],
    );
    out.assert_code(0);
    assert!(
        line_of(&out.stdout, "standalone").contains("true"),
        "{out:?}"
    );
    assert!(
        line_of(&out.stdout, "world_size").contains(" 2 "),
        "{out:?}"
    );
}

/// 25.3: `mpirun -np 1 rdrun --nproc_per_node=2` is one task per node: node mode, two workers
/// (it was refused as "1x2=2 workers; ... launch one task per node").
#[test]
fn one_mpi_rank_with_two_workers_runs_them() {
    let dir = TempDir::new("se_mpi_one");
    let mut r = Rdrun::new().timeout(RUN);
    for (k, v) in [
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "1"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
        ("OMPI_COMM_WORLD_NODE_RANK", "0"),
        ("OMPI_MCA_ess_base_jobid", "1344602113"),
    ] {
        r = r.env(k, v);
    }
    let out = r
        .args(["--nproc_per_node=2", "--no-python"])
        .arg(worker("mn_worker"))
        .arg(dir.path())
        .run();
    out.assert_code(0);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 2, "{out:?}");
    for env in recs.values() {
        assert_eq!(get(env, "WORLD_SIZE"), "2");
        assert_eq!(get(env, "LOCAL_WORLD_SIZE"), "2");
        assert_eq!(get(env, "GROUP_WORLD_SIZE"), "1");
    }
}

/// 25.4: `--nnodes 3` in a 2-node step would wait for a third node until the timeout; it is
/// refused naming both. An override note prints values as typed (`1:2`), never Debug text.
#[test]
fn a_node_count_contradicting_the_step_is_refused_naming_both() {
    let dir = TempDir::new("se_nnodes");
    let x = script(&dir);
    let env = slurm_step_env(1, 12001);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = clean(&env, &["--nnodes", "3", &x]);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        "rdrun: error: --nnodes 3 contradicts the scheduler's fixed node set: slurm-step (job 81234 step 0) gives 2 nodes (SLURM_STEP_NUM_NODES); drop it, or pass --cluster none for a local run\n"
    );
    let out = clean(
        &env,
        &["--dry-run", "--nnodes", "1:2", "--rdzv-backend", "c10d", &x],
    );
    out.assert_code(0);
    assert!(
        out.stdout
            .contains("rdrun:   note: nnodes: 1:2 (--nnodes) overrides 2 (SLURM_STEP_NUM_NODES)\n"),
        "{out:?}"
    );
    assert!(!out.stdout.contains("NodeCount"), "{out:?}");
}

/// 38.6: a node range under a step's fixed node set resolves against it, one note naming the
/// range, the step and its variable: to the step's count on the static rendezvous (`1:3` waited
/// 15 minutes for a third node), to MIN:count on an elastic one; a range the step cannot
/// satisfy is refused in one line, as an exact count is.
#[test]
fn a_node_range_under_the_step_resolves_to_its_count() {
    let dir = TempDir::new("se_range");
    let x = script(&dir);
    let env = slurm_step_env(1, 12001);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = clean(&env, &["--dry-run", "--nnodes", "1:3", &x]);
    out.assert_code(0);
    let o = &out.stdout;
    assert_eq!(
        line_of(o, "nnodes"),
        "rdrun:   nnodes           2  (--nnodes 1:3 within SLURM_STEP_NUM_NODES)"
    );
    assert!(
        line_of(o, "world_size").contains(" 4  (2 nodes x 2 workers"),
        "{o}"
    );
    let notes: Vec<&str> = o
        .lines()
        .filter(|l| l.starts_with("rdrun:   note: nnodes"))
        .collect();
    assert_eq!(
        notes,
        ["rdrun:   note: nnodes: --nnodes 1:3 resolved to 2: slurm-step (job 81234 step 0) gives a fixed set of 2 nodes (SLURM_STEP_NUM_NODES), and a static rendezvous runs exactly the nodes it counts"],
        "{o}"
    );
    let out = clean(&env, &["--print-topology=json", "--nnodes", "2:4", &x]);
    out.assert_code(0);
    let j: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(
        j["fields"]["nnodes"]["value"],
        serde_json::json!({"min": 2, "max": 2})
    );
    assert_eq!(j["run"]["world_size"], "4");
    // Elastic: the job may still go on without a node it lost, never wait for a third.
    let out = clean(
        &env,
        &["--dry-run", "--nnodes", "1:3", "--rdzv-backend", "c10d", &x],
    );
    out.assert_code(0);
    assert_eq!(
        line_of(&out.stdout, "nnodes"),
        "rdrun:   nnodes           1:2  (--nnodes 1:3 within SLURM_STEP_NUM_NODES)"
    );
    assert!(
        out.stdout.contains("rdrun:   note: nnodes: --nnodes 1:3 resolved to 1:2: slurm-step (job 81234 step 0) gives a fixed set of 2 nodes (SLURM_STEP_NUM_NODES), and no other node can join it\n"),
        "{out:?}"
    );
    // A range the step cannot satisfy: one line, exit 1, as `--nnodes 3`.
    let out = clean(&env, &["--nnodes", "3:4", &x]);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        "rdrun: error: --nnodes 3:4 contradicts the scheduler's fixed node set: slurm-step (job 81234 step 0) gives 2 nodes (SLURM_STEP_NUM_NODES); drop it, or pass --cluster none for a local run\n"
    );
}

/// 25.5: LSF slots are CPU slots: `LSB_MCPU_HOSTS="<this host> 2 ..."` is one worker with a
/// note saying why; the GPUs LSF gave this host (CUDA_VISIBLE_DEVICES) are the workers.
#[test]
fn lsf_slots_are_cpu_slots_and_gpus_are_workers() {
    let dir = TempDir::new("se_lsf");
    let x = script(&dir);
    let me = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let hosts = format!("{} 2 lsf-other-host 2", me.trim());
    let job = [("LSB_JOBID", "4242"), ("LSB_MCPU_HOSTS", hosts.as_str())];
    let out = clean(&job, &["--dry-run", &x]);
    out.assert_code(0);
    assert!(out.stdout.contains("source=lsf (job 4242)"), "{out:?}");
    assert!(
        line_of(&out.stdout, "nproc_per_node").contains(" 1  (default)"),
        "{out:?}"
    );
    assert!(
        out.stdout.contains("LSF slots are CPU slots, not workers"),
        "{out:?}"
    );
    let mut gpus = job.to_vec();
    gpus.push(("CUDA_VISIBLE_DEVICES", "0,1"));
    let out = clean(&gpus, &["--dry-run", &x]);
    out.assert_code(0);
    assert!(
        line_of(&out.stdout, "nproc_per_node")
            .contains(" 2  (CUDA_VISIBLE_DEVICES (the GPUs LSF gave this host))"),
        "{out:?}"
    );
}

/// A uuid's shape: five groups of hex digits of lengths 8, 4, 4, 4 and 12, joined by dashes.
fn looks_like_uuid(word: &str) -> bool {
    let groups: Vec<&str> = word.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn uuid_shape_is_told_from_a_test_path() {
    assert!(looks_like_uuid("0f8e4a52-1c1d-4b5e-9a0b-123456789abc"));
    assert!(!looks_like_uuid("/tmp/rdrun-test-2679-426-se_dry/x.py"));
    assert!(!looks_like_uuid("81234.0"));
}

/// 25.6: a dry run says what the run would do: world size, this node's global ranks, the
/// worker command and interpreter, the rendezvous endpoint; a local one shows no made-up run id.
#[test]
fn dry_run_says_what_the_run_would_do() {
    let dir = TempDir::new("se_dry");
    let x = script(&dir);
    let out = clean(
        &[],
        &["--dry-run", "--nproc-per-node", "2", &x, "--lr", "0.1"],
    );
    out.assert_code(0);
    let o = &out.stdout;
    assert_eq!(
        line_of(o, "world_size"),
        "rdrun:   world_size       2  (1 node x 2 workers)"
    );
    assert_eq!(
        line_of(o, "global_ranks"),
        "rdrun:   global_ranks     0-1  (the only node)"
    );
    assert!(
        line_of(o, "rendezvous").contains("127.0.0.1, a free port chosen at launch"),
        "{o}"
    );
    assert!(
        line_of(o, "run_id").contains("a fresh one at launch"),
        "{o}"
    );
    let command = line_of(o, "command");
    let interpreter = line_of(o, "interpreter");
    assert!(command.ends_with(&format!(" -u {x} --lr 0.1")), "{o}");
    let python = interpreter
        .trim_start_matches("rdrun:   interpreter")
        .trim();
    assert!(python.contains("python"), "{o}");
    assert!(
        command.contains(&format!("command          {python} -u ")),
        "{o}"
    );
    // No run id made up for the dry run alone. A uuid is five groups of hex digits, 8-4-4-4-12;
    // a test path can also be 36 characters with 4 dashes (pid and counter digits), so the
    // shape is checked, not the length.
    assert!(!o.split_whitespace().any(looks_like_uuid), "{o}");

    // Node 1 of a 2-node Slurm step with 2 GPUs per node: ranks 2-3 of 4 at node 0's store.
    let env = slurm_step_env(1, 12001);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = clean(&env, &["--dry-run", &x]);
    out.assert_code(0);
    let o = &out.stdout;
    assert!(
        line_of(o, "world_size").contains(" 4  (2 nodes x 2 workers"),
        "{o}"
    );
    assert!(
        line_of(o, "global_ranks").contains(" 2-3  (node rank 1"),
        "{o}"
    );
    assert_eq!(
        line_of(o, "rendezvous"),
        "rdrun:   rendezvous       localhost:12001  (static)"
    );
    assert_eq!(
        line_of(o, "run_id"),
        "rdrun:   run_id           81234.0  (SLURM_JOB_ID.SLURM_STEP_ID)"
    );
    assert_eq!(o.matches("run_id").count(), 1, "one run id row: {o}");
    let out = clean(&env, &["--print-topology=json", &x]);
    out.assert_code(0);
    let j: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(j["run"]["world_size"], "4");
    assert_eq!(j["run"]["global_ranks"], "2-3");
    assert_eq!(j["run"]["rendezvous"]["endpoint"], "localhost:12001");
    assert_eq!(j["run"]["run_id"], "81234.0");
    assert!(
        j["run"]["command"]
            .as_str()
            .is_some_and(|c| c.ends_with(&x)),
        "{j}"
    );
}
