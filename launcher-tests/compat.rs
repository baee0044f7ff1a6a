//! torchrun features that are "same" or "improved" in rdrun (issue 15): `--numa-binding` and
//! `--cpu-binding` seen from real workers' `/proc/self/status`, `--omp-num-threads`, the shell
//! completion scripts loaded in the real shells, and the man page.
//!
//! NUMA topologies are fake sysfs trees (rdrun's test hook `RDRUN_TEST_SYSFS_ROOT` stands for
//! `/` when reading topology files) built over the CPUs this test may use, so real workers get
//! real affinity masks from a topology the machine does not have.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::{Rdrun, TempDir};

/// The CPUs this process may run on (Cpus_allowed_list of /proc/self/status).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    parse_list(line).into_iter().collect()
}

fn parse_list(text: &str) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => {
                out.insert(part.parse().unwrap());
            }
        }
    }
    out
}

fn write(root: &Path, path: &str, text: &str) {
    let p = root.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Runs `nproc` shell workers that record their Cpus_allowed_list and OMP_NUM_THREADS; returns
/// (set, omp) per local rank.
fn bound_workers(
    dir: &TempDir,
    nproc: usize,
    rdrun: Rdrun,
    flags: &[&str],
) -> Vec<(BTreeSet<usize>, String)> {
    let out = rdrun
        .arg("--standalone")
        .arg(format!("--nproc-per-node={nproc}"))
        .args(flags)
        .arg("--no-python")
        .arg("/bin/sh")
        .arg("-c")
        .arg(
            "grep Cpus_allowed_list /proc/self/status > \"$0/aff.$LOCAL_RANK\"; \
             printf %s \"${OMP_NUM_THREADS-unset}\" > \"$0/omp.$LOCAL_RANK\"",
        )
        .arg(dir.path())
        .run();
    out.assert_code(0);
    (0..nproc)
        .map(|r| {
            let aff = std::fs::read_to_string(dir.join(format!("aff.{r}")))
                .unwrap_or_else(|e| panic!("rank {r}: {e}: {out:?}"));
            let omp = std::fs::read_to_string(dir.join(format!("omp.{r}"))).unwrap();
            (
                parse_list(aff.trim().trim_start_matches("Cpus_allowed_list:")),
                omp,
            )
        })
        .collect()
}

/// A fake tree: NUMA node 0 = CPU `a`, node 1 = CPU `b`; GPU 0 (by PCI order) on node 1, GPU 1
/// on node 0, so rank 0 must land on `b`: the identity mapping cannot pass by accident.
fn two_node_tree(root: &Path, a: usize, b: usize) {
    write(
        root,
        "sys/devices/system/node/node0/cpulist",
        &format!("{a}\n"),
    );
    write(
        root,
        "sys/devices/system/node/node1/cpulist",
        &format!("{b}\n"),
    );
    write(root, "sys/devices/system/node/possible", "0-1\n");
    for (pci, node) in [("0000:3b:00.0", 1), ("0000:86:00.0", 0)] {
        let d = format!("sys/bus/pci/devices/{pci}");
        write(root, &format!("{d}/vendor"), "0x10de\n");
        write(root, &format!("{d}/class"), "0x030200\n");
        write(root, &format!("{d}/numa_node"), &format!("{node}\n"));
    }
    for (cpu, package) in [(a, 0), (b, 1)] {
        let d = format!("sys/devices/system/cpu/cpu{cpu}/topology");
        write(
            root,
            &format!("{d}/thread_siblings_list"),
            &format!("{cpu}\n"),
        );
        write(
            root,
            &format!("{d}/physical_package_id"),
            &format!("{package}\n"),
        );
    }
}

#[test]
fn numa_binding_sets_real_worker_affinity() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: needs 2 CPUs in the affinity mask, has {cpus:?}");
        return;
    }
    let (a, b) = (cpus[0], cpus[cpus.len() - 1]);
    let dir = TempDir::new("numa_node");
    let root = dir.join("root");
    two_node_tree(&root, a, b);
    let rdrun = || Rdrun::new().env("RDRUN_TEST_SYSFS_ROOT", &root);
    for mode in ["node", "socket", "exclusive", "core-complex"] {
        if mode == "core-complex" {
            // One L3 per CPU.
            for cpu in [a, b] {
                let d = format!("sys/devices/system/cpu/cpu{cpu}/cache/index3");
                write(&root, &format!("{d}/type"), "Unified\n");
                write(&root, &format!("{d}/level"), "3\n");
                write(&root, &format!("{d}/shared_cpu_list"), &format!("{cpu}\n"));
            }
        }
        let got = bound_workers(&dir, 2, rdrun(), &["--numa-binding", mode]);
        assert_eq!(got[0].0, BTreeSet::from([b]), "{mode}: rank 0");
        assert_eq!(got[1].0, BTreeSet::from([a]), "{mode}: rank 1");
        // torchrun's default stays: OMP_NUM_THREADS=1 with nproc 2.
        assert_eq!(got[0].1, "1", "{mode}");
    }
    // --omp-num-threads cpus: the size of the bound set (1 here).
    let got = bound_workers(
        &dir,
        2,
        rdrun().env("OMP_NUM_THREADS", "7"),
        &["--numa-binding", "node", "--omp-num-threads", "cpus"],
    );
    assert_eq!((got[0].1.as_str(), got[1].1.as_str()), ("1", "1"));
    // CUDA_VISIBLE_DEVICES=1: device 0 is the GPU on node 0.
    let got = bound_workers(
        &dir,
        1,
        rdrun().env("CUDA_VISIBLE_DEVICES", "1"),
        &["--numa-binding=node"],
    );
    assert_eq!(got[0].0, BTreeSet::from([a]));
    // Without the flag nothing is bound: every worker keeps the whole mask.
    let got = bound_workers(&dir, 2, rdrun(), &[]);
    let all: BTreeSet<usize> = cpus.iter().copied().collect();
    assert_eq!((&got[0].0, &got[1].0), (&all, &all));
}

#[test]
fn numa_binding_errors_before_any_worker() {
    let dir = TempDir::new("numa_errors");
    let root = dir.join("root");
    let cpus = allowed_cpus();
    two_node_tree(&root, cpus[0], *cpus.last().unwrap());
    let marker = dir.join("started");
    let run = |rdrun: Rdrun, nproc: usize| {
        rdrun
            .arg(format!("--nproc-per-node={nproc}"))
            .args(["--numa-binding", "node", "--no-python", "/bin/touch"])
            .arg(&marker)
            .run()
    };
    // Three local ranks, two accelerators.
    let out = run(Rdrun::new().env("RDRUN_TEST_SYSFS_ROOT", &root), 3);
    out.assert_code(1);
    assert!(
        out.stderr.contains(
            "rdrun: error: --numa-binding node: cannot bind local rank 2 (accelerator 2): there are only 2 visible accelerators"
        ),
        "{out:?}"
    );
    // No accelerator at all (an empty tree).
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = run(Rdrun::new().env("RDRUN_TEST_SYSFS_ROOT", &empty), 1);
    out.assert_code(1);
    assert!(
        out.stderr
            .contains("rdrun: error: --numa-binding node: no accelerator found (no NVIDIA or AMD GPU in /sys/bus/pci/devices)"),
        "{out:?}"
    );
    assert!(!marker.exists(), "a worker started");
    // Usage errors: exit 2.
    let out = Rdrun::new().args(["--numa-binding", "bogus", "t.py"]).run();
    out.assert_code(2);
    assert!(out.stderr.contains("invalid choice: 'bogus'"), "{out:?}");
    let out = Rdrun::new()
        .args(["--cpu-binding", "--numa-binding", "node", "t.py"])
        .run();
    out.assert_code(2);
    let out = Rdrun::new()
        .args(["--omp-num-threads", "0", "--no-python", "/bin/true"])
        .run();
    out.assert_code(2);
    assert!(
        out.stderr
            .contains("--omp-num-threads '0': must be cpus or a positive integer"),
        "{out:?}"
    );
}

#[test]
fn cpu_binding_shares_the_mask() {
    let cpus = allowed_cpus();
    let nproc = cpus.len().min(4);
    let dir = TempDir::new("cpu_binding");
    let got = bound_workers(
        &dir,
        nproc,
        Rdrun::new(),
        &["--cpu-binding", "--omp-num-threads", "cpus"],
    );
    let mut union = BTreeSet::new();
    for (r, (set, omp)) in got.iter().enumerate() {
        assert!(!set.is_empty(), "rank {r}");
        assert!(set.is_disjoint(&union), "rank {r} shares CPUs: {got:?}");
        union.extend(set.iter().copied());
        assert_eq!(omp, &set.len().to_string(), "rank {r}");
    }
    assert_eq!(union, cpus.iter().copied().collect::<BTreeSet<_>>());
    // Without --omp-num-threads torchrun's rule holds (1 with several workers, else unset).
    let got = bound_workers(&dir, 1, Rdrun::new(), &["--cpu-binding"]);
    assert_eq!(got[0].1, "unset");
    assert_eq!(got[0].0, cpus.iter().copied().collect::<BTreeSet<_>>());
    // More workers than CPUs: an error naming both.
    let n = cpus.len() + 1;
    let out = Rdrun::new()
        .arg(format!("--nproc-per-node={n}"))
        .args(["--cpu-binding", "--no-python", "/bin/true"])
        .run();
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "--cpu-binding: {} CPUs in rdrun's affinity mask cannot give each of {n} workers its own",
            cpus.len()
        )),
        "{out:?}"
    );
}

/// `rdrun --print-completion SHELL` into `dir/name`.
fn completion(dir: &TempDir, shell: &str, name: &str) -> std::path::PathBuf {
    let out = Rdrun::new().args(["--print-completion", shell]).run();
    out.assert_code(0);
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// Runs `prog args` with a hard bound; returns stdout (asserting success).
fn shell(prog: &str, args: &[&str], env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new(prog);
    cmd.args(args).stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill has no memory-safety preconditions; pid is our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{prog} {args:?} did not finish within 60 s");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{prog} {args:?}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn bash_completion_completes_flags_and_values() {
    if !have("bash") {
        eprintln!("skipped: no bash");
        return;
    }
    let dir = TempDir::new("bash_completion");
    let script = completion(&dir, "bash", "rdrun.bash");
    let drive = |words: &str| {
        shell(
            "bash",
            &[
                "--norc",
                "-c",
                &format!(
                    "source \"$SCRIPT\" && complete -p rdrun && COMP_WORDS=({words}) && \
                     COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && _rdrun && printf '%s\\n' \"${{COMPREPLY[@]}}\""
                ),
            ],
            &[("SCRIPT", &script)],
        )
    };
    let out = drive("rdrun --nproc-p");
    assert!(out.contains("complete -F _rdrun rdrun"), "{out}");
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(lines, ["--nproc-per-node"], "{out}");
    let out = drive("rdrun --numa-binding ''");
    let lines: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(
        lines,
        ["node", "socket", "exclusive", "core-complex"],
        "{out}"
    );
    // `--numa-binding=e`: bash splits at '='.
    let out = drive("rdrun --numa-binding = e");
    assert_eq!(
        out.lines().skip(1).collect::<Vec<_>>(),
        ["exclusive"],
        "{out}"
    );
    // After the script the words belong to it: no rdrun flags offered.
    let out = drive("rdrun --nproc-per-node 2 train.py --nproc");
    assert_eq!(
        out.lines().skip(1).filter(|l| !l.is_empty()).count(),
        0,
        "{out}"
    );
}

#[test]
fn zsh_completion_loads_and_completes_a_flag() {
    if !have("zsh") {
        eprintln!("skipped: no zsh");
        return;
    }
    let dir = TempDir::new("zsh_completion");
    let fpath = dir.join("fpath");
    std::fs::create_dir_all(&fpath).unwrap();
    let script = completion(&dir, "zsh", "fpath/_rdrun");
    assert!(script.exists());
    let zdotdir = dir.join("zdotdir");
    std::fs::create_dir_all(&zdotdir).unwrap();
    // compinit finds `_rdrun` through its #compdef line; then a real completion in a
    // pseudo-terminal (zpty) of `rdrun --numa-bind<TAB>` and of its values.
    let probe = r#"
fpath=("$FPATH_DIR" $fpath)
autoload -U compinit && compinit -u -d "$ZDOTDIR/.zcompdump"
print -r -- "registered: ${_comps[rdrun]}"
autoload +X _rdrun && print -r -- "loaded"
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z 'PS1="> "; fpath=("$FPATH_DIR" $fpath); autoload -U compinit; compinit -u -d "$ZDOTDIR/.zcompdump2"; zstyle ":completion:*" list-rows-first true'
zpty -w z 'print READY'
zpty -r -m z line '*READY*' ; zpty -r -m z line '*READY*'
zpty -w -n z $'rdrun --numa-bind\t'
sleep 2
zpty -w -n z $'\C-e\C-u'
zpty -w z 'print DONE1'
out=""
while zpty -r -t z chunk; do out+=$chunk; [[ $out == *DONE1*DONE1* ]] && break; done
print -r -- "FLAG<<$out>>"
zpty -w -n z $'rdrun --numa-binding \t'
sleep 2
zpty -w -n z $'\C-e\C-u'
zpty -w z 'print DONE2'
out=""
while zpty -r -t z chunk; do out+=$chunk; [[ $out == *DONE2*DONE2* ]] && break; done
print -r -- "VALUES<<$out>>"
zpty -d z
"#;
    let out = shell(
        "zsh",
        &["-f", "-c", probe],
        &[("FPATH_DIR", &fpath), ("ZDOTDIR", &zdotdir)],
    );
    assert!(out.contains("registered: _rdrun"), "{out}");
    assert!(out.contains("loaded"), "{out}");
    let flag = out.split("FLAG<<").nth(1).unwrap_or("");
    assert!(
        flag.contains("rdrun --numa-binding"),
        "flag not completed: {out}"
    );
    let values = out.split("VALUES<<").nth(1).unwrap_or("");
    for v in ["node", "socket", "exclusive", "core-complex"] {
        assert!(values.contains(v), "{v} not offered: {out}");
    }
}

#[test]
fn fish_and_tcsh_completions_load() {
    let dir = TempDir::new("fish_completion");
    if have("fish") {
        let script = completion(&dir, "fish", "rdrun.fish");
        let out = shell(
            "fish",
            &[
                "--no-config",
                "-c",
                "source $SCRIPT; and complete -C 'rdrun --nproc-p'; and complete -C 'rdrun --numa-binding '",
            ],
            &[("SCRIPT", &script)],
        );
        assert!(
            out.lines().any(|l| l.starts_with("--nproc-per-node")),
            "{out}"
        );
        for v in ["node", "socket", "exclusive", "core-complex"] {
            assert!(out.lines().any(|l| l.starts_with(v)), "{v}: {out}");
        }
    } else {
        eprintln!("skipped: no fish");
    }
    if have("tcsh") {
        let script = completion(&dir, "tcsh", "rdrun.tcsh");
        // Loads without a syntax error and registers the command.
        let out = shell(
            "tcsh",
            &["-f", "-c", "source $SCRIPT && complete rdrun"],
            &[("SCRIPT", &script)],
        );
        assert!(
            out.contains("--numa-binding") || out.contains("numa-binding"),
            "{out}"
        );
    } else {
        eprintln!("skipped: no tcsh");
    }
}

#[test]
fn man_page_renders() {
    let out = Rdrun::new().arg("--print-man").run();
    out.assert_code(0);
    assert!(out.stdout.starts_with(".TH RDRUN 1"), "{out:?}");
    if !have("groff") {
        eprintln!("skipped rendering: no groff");
        return;
    }
    let dir = TempDir::new("man_page");
    let page = dir.join("rdrun.1");
    std::fs::write(&page, &out.stdout).unwrap();
    let text = shell(
        "sh",
        &["-c", "groff -man -Tutf8 -P-c -ww \"$PAGE\" 2>&1 | col -b"],
        &[("PAGE", &page)],
    );
    assert!(!text.contains("warning"), "{text}");
    for flag in [
        "--numa-binding",
        "--nproc-per-node",
        "--print-completion",
        "PET_NPROC_PER_NODE",
    ] {
        assert!(text.contains(flag), "{flag} missing:\n{text}");
    }
}

/// The torch venv's python and torchrun (scripts/torch-venv.sh), if installed.
fn torch_venv() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/rdrun")))?;
    let bin = cache.join("torch-venv/bin");
    let python = bin.join("python");
    python.exists().then(|| (python, bin.join("torchrun")))
}

/// A gloo all_reduce through `env://`; each rank writes `RANK USE_AGENT_STORE SUM OWNER` where
/// OWNER says whether this process itself listens on MASTER_PORT (its own socket inodes against
/// /proc/net/tcp{,6} LISTEN entries).
const OWN_STORE_PY: &str = r#"
import os, sys
import torch, torch.distributed as dist
out = sys.argv[1]
port = int(os.environ["MASTER_PORT"])
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
listening = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        f = line.split()
        if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
            listening.add(f[9])
owner = "owner" if inodes & listening else ("other" if listening else "none")
dist.barrier()
with open(f"{out}/r{dist.get_rank()}", "w") as fh:
    fh.write(f"{dist.get_rank()} {os.environ['TORCHELASTIC_USE_AGENT_STORE']} {int(t.item())} {owner}")
dist.destroy_process_group()
"#;

#[test]
fn disable_share_rdzv_tcp_store_rank0_hosts_its_own() {
    let Some((python, torchrun)) = torch_venv() else {
        eprintln!("skipped: no torch venv (scripts/torch-venv.sh)");
        return;
    };
    let dir = TempDir::new("own_store");
    let script = dir.join("own_store.py");
    std::fs::write(&script, OWN_STORE_PY).unwrap();
    let read = |tag: &str| -> Vec<String> {
        (0..2)
            .map(|r| std::fs::read_to_string(dir.join(format!("{tag}/r{r}"))).unwrap_or_default())
            .collect()
    };
    let port = crate::util::free_port().to_string();
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("standalone", vec!["--standalone".into()]),
        (
            "c10d",
            vec![
                "--rdzv-backend=c10d".into(),
                format!("--rdzv-endpoint=127.0.0.1:{port}"),
                "--rdzv-id=own".into(),
            ],
        ),
    ];
    for (tag, flags) in &cases {
        for disable in [true, false] {
            let out_dir = dir.join(format!("{tag}-{disable}"));
            std::fs::create_dir_all(&out_dir).unwrap();
            let mut run = Rdrun::new()
                .env("PYTHON_EXEC", &python)
                .env("OMP_NUM_THREADS", "1")
                .timeout(Duration::from_secs(120))
                .args(flags)
                .arg("--nproc-per-node=2")
                .arg(&script)
                .arg(&out_dir);
            if disable {
                run = run.env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1");
            }
            let out = run.run();
            out.assert_code(0);
            let got = read(&format!("{tag}-{disable}"));
            // Shared (the default): rdrun's store listens on MASTER_PORT, no worker does.
            if disable {
                assert_eq!(
                    got,
                    ["0 False 3 owner", "1 False 3 other"],
                    "{tag}: {out:?}"
                );
            } else {
                assert_eq!(
                    got,
                    ["0 True 3 other", "1 True 3 other"],
                    "{tag} shared: {out:?}"
                );
            }
        }
    }
    // The reference: torchrun from the same venv says the same for the opt-out.
    if torchrun.exists() {
        let out_dir = dir.join("torchrun");
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = Command::new(&torchrun)
            .args(["--standalone", "--nproc-per-node=2"])
            .arg(&script)
            .arg(&out_dir)
            .env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
            .env("OMP_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(read("torchrun"), ["0 False 3 owner", "1 False 3 other"]);
    }
}

/// A cgroup-v1 freezer group made by the test: a frozen task is in uninterruptible sleep (state
/// D). Drop thaws it and removes the group (as in `signals.rs`).
struct Frozen {
    dir: std::path::PathBuf,
}

impl Frozen {
    fn freeze(pid: i32) -> Option<Frozen> {
        let root = Path::new("/sys/fs/cgroup/freezer");
        if !root.join("cgroup.procs").exists() {
            return None;
        }
        let dir = root.join(format!("rdrun-test-compat-{}-{pid}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let frozen = Frozen { dir };
        std::fs::write(frozen.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        std::fs::write(frozen.dir.join("freezer.state"), "FROZEN").ok()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            let state = std::fs::read_to_string(frozen.dir.join("freezer.state")).ok()?;
            if state.trim() == "FROZEN" {
                return Some(frozen);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.dir).is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn uninterruptible_state_timeout_fails_the_group_without_restart() {
    use crate::util::{assert_no_leak, fixture_pids, wait_ready, worker};
    let dir = TempDir::new("dstate");
    let run = Rdrun::new()
        .env("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", "1.5")
        .args([
            "--standalone",
            "--nproc-per-node=2",
            "--max-restarts=3",
            "--shutdown-timeout=1",
            "--no-python",
        ])
        .arg(worker("pid_then_sleep"))
        .arg(dir.path())
        .timeout(Duration::from_secs(120))
        .spawn();
    wait_ready(dir.path(), 2);
    let pids = fixture_pids(dir.path(), 2);
    let Some(frozen) = Frozen::freeze(pids[1]) else {
        run.signal(libc::SIGKILL);
        run.wait();
        assert_no_leak(&pids, Duration::from_secs(10));
        eprintln!("skipped: needs root and the cgroup-v1 freezer to put a worker in D state");
        return;
    };
    let out = run.wait();
    drop(frozen);
    assert!(!out.timed_out, "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "worker pid={} (rank 1) stuck in uninterruptible sleep (D state) for",
            pids[1]
        )) && out.stderr.contains("restarts disabled"),
        "{out:?}"
    );
    // Restarts were left (3) but none was made.
    assert!(!out.stderr.contains("restarting (attempt"), "{out:?}");
    // The root cause is the wedged worker, with why; its status (SIGKILL sent, never exited).
    out.assert_code(128 + libc::SIGKILL);
    assert!(
        out.stderr.contains("traceback : hang: worker pid=")
            && out.stderr.contains("rank      : 1 (local_rank: 1)"),
        "{out:?}"
    );
    assert_no_leak(&pids, Duration::from_secs(10));
}

#[test]
fn worker_identical_keeps_real_ranks() {
    use crate::util::{free_port, parse_env0, worker};
    for (nprocs, warn) in [([2usize, 2usize], false), ([2, 1], true)] {
        let dir = TempDir::new("identical");
        let port = free_port();
        let runs: Vec<_> = (0..2)
            .map(|node| {
                Rdrun::new()
                    .env("TORCH_ELASTIC_WORKER_IDENTICAL", "1")
                    .timeout(Duration::from_secs(120))
                    .args(["--nnodes", "2", "--node-rank", &node.to_string()])
                    .arg(format!("--nproc-per-node={}", nprocs[node]))
                    .args([
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        &port.to_string(),
                    ])
                    .arg("--no-python")
                    .arg(worker("print_env"))
                    .arg(dir.path())
                    .spawn()
            })
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        let world: usize = nprocs.iter().sum();
        for out in &outs {
            out.assert_code(0);
            assert_eq!(
                out.stderr.contains("TORCH_ELASTIC_WORKER_IDENTICAL=1 but the nodes run different numbers of workers"),
                warn,
                "{out:?}"
            );
        }
        // Every RANK once, WORLD_SIZE the real total, each node's ranks contiguous from the
        // sum of the lower nodes' counts (equal to torch's GROUP_RANK * nproc + LOCAL_RANK when
        // the nodes are identical).
        for rank in 0..world {
            let text = std::fs::read_to_string(dir.join(format!("env.{rank}.0")))
                .unwrap_or_else(|e| panic!("rank {rank}: {e}: {outs:?}"));
            let env = parse_env0(&text);
            let group: usize = env["GROUP_RANK"].parse().unwrap();
            let local: usize = env["LOCAL_RANK"].parse().unwrap();
            assert_eq!(env["WORLD_SIZE"], world.to_string());
            assert_eq!(env["ROLE_WORLD_SIZE"], world.to_string());
            assert_eq!(rank, nprocs[..group].iter().sum::<usize>() + local);
            if !warn {
                assert_eq!(rank, group * nprocs[0] + local);
            }
        }
    }
}
