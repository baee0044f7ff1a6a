//! Tests of config/numa.rs (the binding modes over fake sysfs trees).

use super::*;
use crate::config::FileKind;
use std::collections::HashMap;

/// A machine whose `/sys` and `/proc` are a directory tree (the fake sysfs), with a given
/// affinity mask.
pub(crate) struct TreeHost {
    pub root: tempfile::TempDir,
    pub allowed: Vec<usize>,
}

impl TreeHost {
    fn new(allowed: std::ops::Range<usize>) -> TreeHost {
        TreeHost {
            root: tempfile::tempdir().unwrap(),
            allowed: allowed.collect(),
        }
    }
    fn write(&self, path: &str, text: &str) {
        let p = self.root.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    fn gpu(&self, pci: &str, node: i64) {
        let d = format!("/sys/bus/pci/devices/{pci}");
        self.write(&format!("{d}/vendor"), "0x10de\n");
        self.write(&format!("{d}/class"), "0x030200\n");
        self.write(&format!("{d}/numa_node"), &format!("{node}\n"));
    }
    fn nic(&self, pci: &str) {
        let d = format!("/sys/bus/pci/devices/{pci}");
        self.write(&format!("{d}/vendor"), "0x15b3\n");
        self.write(&format!("{d}/class"), "0x020000\n");
        self.write(&format!("{d}/numa_node"), "0\n");
    }
    fn node(&self, n: usize, cpus: &str) {
        self.write(&format!("/sys/devices/system/node/node{n}/cpulist"), cpus);
    }
    /// `cpu` with its hyper-thread siblings, package and L3 group.
    fn cpu(&self, cpu: usize, siblings: &str, package: usize, l3: &str) {
        let d = format!("/sys/devices/system/cpu/cpu{cpu}");
        self.write(&format!("{d}/topology/thread_siblings_list"), siblings);
        self.write(
            &format!("{d}/topology/physical_package_id"),
            &package.to_string(),
        );
        for (i, (ty, level, shared)) in [
            ("Data", 1, siblings),
            ("Instruction", 1, siblings),
            ("Unified", 2, siblings),
            ("Unified", 3, l3),
        ]
        .iter()
        .enumerate()
        {
            self.write(&format!("{d}/cache/index{i}/type"), ty);
            self.write(&format!("{d}/cache/index{i}/level"), &level.to_string());
            self.write(&format!("{d}/cache/index{i}/shared_cpu_list"), shared);
        }
    }
}

impl Host for TreeHost {
    fn cpu_count(&self) -> usize {
        self.allowed.len()
    }
    fn nvidia_gpu_count(&self) -> Option<usize> {
        None
    }
    fn file(&self, _: &Path) -> FileKind {
        FileKind::Missing
    }
    fn random_bytes(&self) -> [u8; 16] {
        [0; 16]
    }
    fn process_limit(&self) -> Option<u64> {
        None
    }
    fn read_text(&self, path: &Path) -> Option<String> {
        super::super::host::read_text_under(self.root.path(), path)
    }
    fn list_dir(&self, path: &Path) -> Option<Vec<String>> {
        super::super::host::list_dir_under(self.root.path(), path)
    }
    fn allowed_cpus(&self) -> Vec<usize> {
        self.allowed.clone()
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn run(
    host: &TreeHost,
    mode: &str,
    nproc: usize,
    env: &HashMap<&str, &str>,
) -> Result<Vec<String>, String> {
    let lookup = |k: &str| env.get(k).map(|v| v.to_string());
    resolve(
        NumaMode::parse(mode),
        mode == "cpu",
        None,
        nproc,
        &lookup,
        host,
    )
    .map(|b| b.cpus.iter().map(|c| format_cpu_list(c)).collect())
}

/// Two sockets, each one NUMA node of 4 cores × 2 threads (node 0: CPUs 0-3 and their
/// siblings 8-11; node 1: 4-7 and 12-15), two L3 groups per node, 2 GPUs per node.
fn two_by_two() -> TreeHost {
    let h = TreeHost::new(0..16);
    h.node(0, "0-3,8-11\n");
    h.node(1, "4-7,12-15\n");
    h.write("/sys/devices/system/node/possible", "0-1\n");
    for c in 0..8 {
        let sib = format!("{c},{}", c + 8);
        let l3 = match c {
            0 | 1 => "0-1,8-9",
            2 | 3 => "2-3,10-11",
            4 | 5 => "4-5,12-13",
            _ => "6-7,14-15",
        };
        h.cpu(c, &sib, c / 4, l3);
        h.cpu(c + 8, &sib, c / 4, l3);
    }
    // PCI order is not the order the directories are created in.
    h.gpu("0000:c1:00.0", 1);
    h.gpu("0000:1b:00.0", 0);
    h.gpu("0000:2a:00.0", 0);
    h.gpu("0000:db:00.0", 1);
    h.nic("0000:05:00.0");
    h
}

#[test]
fn two_nodes_two_gpus_each() {
    let h = two_by_two();
    let env = HashMap::new();
    assert_eq!(
        run(&h, "node", 4, &env).unwrap(),
        ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]
    );
    // One node per socket: socket = node.
    assert_eq!(
        run(&h, "socket", 4, &env).unwrap(),
        ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]
    );
    // Four physical cores per node split between its two GPUs, siblings together.
    assert_eq!(
        run(&h, "exclusive", 4, &env).unwrap(),
        ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]
    );
    assert_eq!(
        run(&h, "core-complex", 4, &env).unwrap(),
        ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]
    );
    // CUDA_VISIBLE_DEVICES reorders: device 0 is physical GPU 3 (node 1).
    let env: HashMap<&str, &str> = [("CUDA_VISIBLE_DEVICES", "3,0")].into();
    assert_eq!(run(&h, "node", 2, &env).unwrap(), ["4-7,12-15", "0-3,8-11"]);
    // Exclusive counts only the visible devices of the node: each gets the whole node.
    assert_eq!(
        run(&h, "exclusive", 2, &env).unwrap(),
        ["4-7,12-15", "0-3,8-11"]
    );
    // More local ranks than visible accelerators: an error naming the rank.
    let e = run(&h, "node", 3, &env).unwrap_err();
    assert!(
        e.contains("local rank 2") && e.contains("only 2 visible"),
        "{e}"
    );
}

#[test]
fn affinity_mask_is_respected() {
    let mut h = two_by_two();
    h.allowed = vec![0, 1, 2, 4, 5];
    let env = HashMap::new();
    assert_eq!(
        run(&h, "node", 4, &env).unwrap(),
        ["0-2", "0-2", "4-5", "4-5"]
    );
    // Three usable cores on node 0 for two GPUs: the first gets the extra one.
    assert_eq!(
        run(&h, "exclusive", 4, &env).unwrap(),
        ["0-1", "2", "4", "5"]
    );
    // Core complexes with more usable CPUs come first.
    assert_eq!(
        run(&h, "core-complex", 4, &env).unwrap(),
        ["0-1", "2", "4-5", "4-5"]
    );
    h.allowed = vec![0, 1];
    let e = run(&h, "node", 4, &env).unwrap_err();
    assert!(
        e.contains("local rank 2") && e.contains("affinity mask"),
        "{e}"
    );
}

#[test]
fn gpus_on_one_node() {
    // Two nodes on one socket; both GPUs on node 1.
    let h = TreeHost::new(0..8);
    h.node(0, "0-3");
    h.node(1, "4-7");
    h.write("/sys/devices/system/node/possible", "0-1");
    for c in 0..8 {
        h.cpu(c, &c.to_string(), 0, if c < 4 { "0-3" } else { "4-7" });
    }
    h.gpu("0000:3b:00.0", 1);
    h.gpu("0000:5e:00.0", 1);
    let env = HashMap::new();
    assert_eq!(run(&h, "node", 2, &env).unwrap(), ["4-7", "4-7"]);
    assert_eq!(run(&h, "socket", 2, &env).unwrap(), ["0-7", "0-7"]);
    assert_eq!(run(&h, "exclusive", 2, &env).unwrap(), ["4-5", "6-7"]);
    // One core complex on the node: both share it.
    assert_eq!(run(&h, "core-complex", 2, &env).unwrap(), ["4-7", "4-7"]);
}

#[test]
fn no_numa() {
    // numa_node -1 and no /sys/devices/system/node at all: every allowed CPU.
    let h = TreeHost::new(0..4);
    for c in 0..4 {
        h.cpu(c, &c.to_string(), 0, "0-3");
    }
    h.gpu("0000:01:00.0", -1);
    h.gpu("0000:02:00.0", -1);
    let env = HashMap::new();
    assert_eq!(run(&h, "node", 2, &env).unwrap(), ["0-3", "0-3"]);
    assert_eq!(run(&h, "socket", 2, &env).unwrap(), ["0-3", "0-3"]);
    assert_eq!(run(&h, "exclusive", 2, &env).unwrap(), ["0-1", "2-3"]);
    // A single-node machine that has node0: -1 reads as node 0.
    h.node(0, "0-3");
    assert_eq!(run(&h, "exclusive", 2, &env).unwrap(), ["0-1", "2-3"]);
}

#[test]
fn errors_are_one_line_reasons() {
    let h = TreeHost::new(0..4);
    assert!(run(&h, "node", 1, &HashMap::new())
        .unwrap_err()
        .contains("no accelerator found"));
    h.gpu("0000:01:00.0", 0);
    h.node(0, "0-1");
    let env: HashMap<&str, &str> = [("CUDA_VISIBLE_DEVICES", "-1")].into();
    assert!(run(&h, "node", 1, &env)
        .unwrap_err()
        .contains("no accelerator is visible"));
    // Exclusive with more GPUs than cores on a node.
    h.gpu("0000:02:00.0", 0);
    h.gpu("0000:03:00.0", 0);
    let e = run(&h, "exclusive", 3, &HashMap::new()).unwrap_err();
    assert!(
        e.contains("only 2 physical cores on NUMA node 0, but 3"),
        "{e}"
    );
    // Node file missing while the node directory exists.
    let e = run(&h, "node", 1, &HashMap::new());
    assert_eq!(e.unwrap(), ["0-1"]);
    h.write("/sys/bus/pci/devices/0000:01:00.0/numa_node", "3");
    let e = run(&h, "node", 1, &HashMap::new()).unwrap_err();
    assert!(e.contains("NUMA node 3"), "{e}");
}

#[test]
fn uuid_entries() {
    let h = two_by_two();
    h.write(
        "/proc/driver/nvidia/gpus/0000:db:00.0/information",
        "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-aaaa-bbbb\n",
    );
    let env: HashMap<&str, &str> = [("CUDA_VISIBLE_DEVICES", "GPU-aaaa")].into();
    assert_eq!(run(&h, "node", 1, &env).unwrap(), ["4-7,12-15"]);
    let env: HashMap<&str, &str> = [("CUDA_VISIBLE_DEVICES", "MIG-1234")].into();
    assert!(run(&h, "node", 1, &env).unwrap_err().contains("MIG"));
}

#[test]
fn cpu_binding_shares() {
    let h = two_by_two();
    let env = HashMap::new();
    // 8 cores for 3 ranks: 3, 3, 2 cores, siblings together.
    assert_eq!(
        run(&h, "cpu", 3, &env).unwrap(),
        ["0-2,8-10", "3-5,11-13", "6-7,14-15"]
    );
    // More ranks than cores: logical CPUs.
    assert_eq!(run(&h, "cpu", 16, &env).unwrap().len(), 16);
    assert_eq!(run(&h, "cpu", 16, &env).unwrap()[15], "15");
    assert!(run(&h, "cpu", 17, &env).unwrap_err().contains("16 CPUs"));
    // No sysfs at all: logical CPUs of the mask.
    let bare = TreeHost::new(0..4);
    assert_eq!(run(&bare, "cpu", 2, &env).unwrap(), ["0-1", "2-3"]);
}

#[test]
fn omp_threads() {
    let h = two_by_two();
    let b = resolve(None, true, Some(OmpThreads::Cpus), 3, &no_env, &h).unwrap();
    assert_eq!(b.omp_threads, [6, 6, 4]);
    let b = resolve(None, false, Some(OmpThreads::Cpus), 3, &no_env, &h).unwrap();
    assert!(b.cpus.is_empty());
    assert_eq!(b.omp_threads, [5, 5, 5]);
    let b = resolve(None, false, Some(OmpThreads::Fixed(7)), 2, &no_env, &h).unwrap();
    assert_eq!(b.omp_threads, [7, 7]);
    assert_eq!(OmpThreads::parse("0"), None);
    assert_eq!(OmpThreads::parse("x"), None);
    let b = resolve(None, false, None, 2, &no_env, &h).unwrap();
    assert_eq!(b, Binding::default());
}

#[test]
fn cpu_lists() {
    assert_eq!(
        parse_cpu_list("0-2,4, 6-7\n")
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        [0, 1, 2, 4, 6, 7]
    );
    assert!(parse_cpu_list("").unwrap().is_empty());
    assert!(parse_cpu_list("3-1").is_none());
    assert!(parse_cpu_list("a").is_none());
    assert_eq!(format_cpu_list(&[0, 1, 2, 4, 6, 7]), "0-2,4,6-7");
    assert_eq!(format_cpu_list(&[]), "");
    assert_eq!(split_range(5, 2, 0), Some((0, 3)));
    assert_eq!(split_range(5, 2, 1), Some((3, 5)));
    assert_eq!(split_range(1, 2, 0), None);
}
