//! CPU binding of workers: `--numa-binding node|socket|exclusive|core-complex` (torch 2.15's
//! `torch/numa/binding.py`, mode by mode), rdrun's `--cpu-binding` for CPU-only jobs, and
//! `--omp-num-threads cpus|N`.
//!
//! Everything is decided here, before any worker starts, from sysfs read through the [`Host`]
//! seam (so fake trees test it): the accelerator whose index is the local rank → its PCI
//! device → `numa_node` → the node's `cpulist`, thread siblings for physical cores, the largest
//! unified/data cache's `shared_cpu_list` for core complexes, `physical_package_id` for sockets;
//! always intersected with rdrun's own affinity mask, as torch intersects with its agent's. The
//! supervisor applies the sets with `sched_setaffinity` between fork and exec (torch prefixes
//! `numactl --physcpubind`, so it needs numactl; rdrun does not).
//!
//! Accelerator index → PCI device: torch asks the CUDA runtime. rdrun has no CUDA, so it lists
//! the NVIDIA (and AMD) display/3D controllers in `/sys/bus/pci/devices` in PCI bus order (the
//! order `nvidia-smi` and `CUDA_DEVICE_ORDER=PCI_BUS_ID` use, and CUDA's default on machines with
//! one GPU model) and applies CUDA_VISIBLE_DEVICES (else HIP_VISIBLE_DEVICES) as the runtime
//! does: indices, or `GPU-` UUID prefixes looked up in the driver's
//! `/proc/driver/nvidia/gpus/<addr>/information`, up to the first entry that is neither.
//!
//! Differences from torch, on purpose (docs/compat.md): a machine without
//! `/sys/devices/system/node` (a kernel without NUMA) is one node holding every allowed CPU
//! (torch: "Could not determine CPUs"); NUMA nodes without allowed CPUs (memory-only, CXL) are
//! skipped when collecting a socket's nodes (torch: `min()` of an empty set); a core whose
//! `thread_siblings_list` is missing counts as a core of its own. Every other failure torch
//! raises is an error here too, before any worker starts.
//!
//! Length: about 530 lines of code, torch's four binding modes plus `--cpu-binding`; the rest are
//! fake-sysfs unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::host::Host;
use crate::cli::EnvFn;

/// `--numa-binding` modes (torch's `AffinityMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumaMode {
    Node,
    Socket,
    Exclusive,
    CoreComplex,
}

impl NumaMode {
    pub fn parse(text: &str) -> Option<NumaMode> {
        match text {
            "node" => Some(NumaMode::Node),
            "socket" => Some(NumaMode::Socket),
            "exclusive" => Some(NumaMode::Exclusive),
            "core-complex" => Some(NumaMode::CoreComplex),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NumaMode::Node => "node",
            NumaMode::Socket => "socket",
            NumaMode::Exclusive => "exclusive",
            NumaMode::CoreComplex => "core-complex",
        }
    }
}

/// `--omp-num-threads`: the number of CPUs of the worker's binding, or a fixed count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OmpThreads {
    Cpus,
    Fixed(usize),
}

impl OmpThreads {
    pub fn parse(text: &str) -> Option<OmpThreads> {
        let t = text.trim();
        if t == "cpus" {
            return Some(OmpThreads::Cpus);
        }
        match t.parse::<usize>() {
            Ok(n) if n > 0 => Some(OmpThreads::Fixed(n)),
            _ => None,
        }
    }
}

/// What the supervisor applies to each local rank; the default binds nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Binding {
    /// The CPUs of each local rank (index = local rank), sorted; empty = no binding.
    pub cpus: Vec<Vec<usize>>,
    /// OMP_NUM_THREADS of each local rank when `--omp-num-threads` was given; empty = torchrun's
    /// rule (1 when unset and nproc > 1, `workerenv::should_set_omp_num_threads`).
    pub omp_threads: Vec<usize>,
    /// Where the sets came from, for the log line (`--numa-binding node`, `--cpu-binding`).
    pub source: String,
    /// Per local rank: why it got its set (`NUMA node 1, GPU 0000:1b:00.0`), for the log line.
    pub why: Vec<String>,
}

impl Binding {
    /// The set of local rank `local_rank`, if there is a binding.
    pub fn cpus_of(&self, local_rank: usize) -> Option<&[usize]> {
        self.cpus.get(local_rank).map(Vec::as_slice)
    }

    /// OMP_NUM_THREADS for `local_rank` when the user asked for one.
    pub fn omp_of(&self, local_rank: usize) -> Option<usize> {
        self.omp_threads.get(local_rank).copied()
    }
}

/// The binding the flags ask for; `Err` is the one-line reason (the caller names the flag).
pub fn resolve(
    numa: Option<NumaMode>,
    cpu_binding: bool,
    omp: Option<OmpThreads>,
    nproc: usize,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<Binding, String> {
    let mut b = Binding::default();
    let topo = Topology { host };
    if let Some(mode) = numa {
        b.source = format!("--numa-binding {}", mode.name());
        let gpus = visible_accelerators(env, host)?;
        for local_rank in 0..nproc {
            let (set, why) = topo.for_device(mode, local_rank, &gpus).map_err(|e| {
                format!("cannot bind local rank {local_rank} (accelerator {local_rank}): {e}")
            })?;
            if set.is_empty() {
                return Err(format!(
                    "cannot bind local rank {local_rank}: no CPU of its set is in rdrun's affinity mask"
                ));
            }
            b.cpus.push(set.into_iter().collect());
            b.why.push(why);
        }
    } else if cpu_binding {
        b.source = "--cpu-binding".into();
        b.cpus = topo.shares(nproc)?;
        b.why = vec!["its share of rdrun's affinity mask".into(); nproc];
    }
    if let Some(omp) = omp {
        let allowed = host.allowed_cpus().len().max(1);
        b.omp_threads = (0..nproc)
            .map(|r| match omp {
                OmpThreads::Fixed(n) => n,
                OmpThreads::Cpus => b
                    .cpus
                    .get(r)
                    .map_or((allowed / nproc.max(1)).max(1), Vec::len),
            })
            .collect();
    }
    Ok(b)
}

/// One accelerator a CUDA/HIP program sees, in device-index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accelerator {
    /// PCI address as in `/sys/bus/pci/devices` (`0000:1b:00.0`).
    pub pci: String,
}

const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// The accelerators in device-index order (see the module docs for the mapping).
pub fn visible_accelerators(env: EnvFn<'_>, host: &dyn Host) -> Result<Vec<Accelerator>, String> {
    let mut all: Vec<(String, bool)> = Vec::new();
    for addr in host.list_dir(Path::new(PCI_DEVICES)).unwrap_or_default() {
        let dir = Path::new(PCI_DEVICES).join(&addr);
        let vendor = host.read_text(&dir.join("vendor")).unwrap_or_default();
        let class = host.read_text(&dir.join("class")).unwrap_or_default();
        let class = u32::from_str_radix(class.trim().trim_start_matches("0x"), 16).unwrap_or(0);
        let (base, sub) = (class >> 16, (class >> 8) & 0xff);
        let nvidia = vendor.trim() == "0x10de" && base == 0x03 && matches!(sub, 0x00 | 0x02);
        let amd = vendor.trim() == "0x1002" && base == 0x03 && matches!(sub, 0x02 | 0x80);
        if nvidia || amd {
            all.push((addr, nvidia));
        }
    }
    all.sort();
    if all.is_empty() {
        return Err("no accelerator found (no NVIDIA or AMD GPU in /sys/bus/pci/devices)".into());
    }
    let visible = env("CUDA_VISIBLE_DEVICES").or_else(|| env("HIP_VISIBLE_DEVICES"));
    let Some(list) = visible else {
        return Ok(all
            .into_iter()
            .map(|(pci, _)| Accelerator { pci })
            .collect());
    };
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim) {
        if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            match entry.parse::<usize>().ok().and_then(|i| all.get(i)) {
                Some((pci, _)) => out.push(Accelerator { pci: pci.clone() }),
                None => break,
            }
        } else if entry.starts_with("GPU-") {
            let found: Vec<&String> = all
                .iter()
                .filter(|(_, nv)| *nv)
                .map(|(pci, _)| pci)
                .filter(|pci| nvidia_uuid(host, pci).is_some_and(|u| u.starts_with(entry)))
                .collect();
            match found.as_slice() {
                [one] => out.push(Accelerator {
                    pci: (*one).clone(),
                }),
                _ => break,
            }
        } else {
            // The CUDA runtime stops at the first entry it cannot read (`-1` hides everything);
            // a MIG UUID names a slice whose PCI device rdrun cannot look up.
            if entry.starts_with("MIG-") {
                return Err(format!(
                    "a MIG device ({entry}) in the visible devices cannot be mapped to its PCI device"
                ));
            }
            break;
        }
    }
    if out.is_empty() {
        return Err(format!(
            "no accelerator is visible (visible devices {list:?})"
        ));
    }
    Ok(out)
}

/// The `GPU UUID:` line of the NVIDIA driver's procfs entry of `pci`.
fn nvidia_uuid(host: &dyn Host, pci: &str) -> Option<String> {
    let text = host.read_text(&PathBuf::from(format!(
        "/proc/driver/nvidia/gpus/{pci}/information"
    )))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("GPU UUID:"))
        .map(|u| u.trim().to_string())
}

/// sysfs CPU topology, read through the host.
struct Topology<'h> {
    host: &'h dyn Host,
}

impl Topology<'_> {
    fn read(&self, path: &str) -> Result<String, String> {
        self.host
            .read_text(Path::new(path))
            .ok_or_else(|| format!("cannot read {path}"))
    }

    fn allowed(&self) -> BTreeSet<usize> {
        self.host.allowed_cpus().into_iter().collect()
    }

    fn numa_node_of(&self, acc: &Accelerator) -> Result<usize, String> {
        let path = format!("{PCI_DEVICES}/{}/numa_node", acc.pci);
        let text = self.read(&path)?;
        let n: i64 = text
            .trim()
            .parse()
            .map_err(|_| format!("{path}: not a number: {:?}", text.trim()))?;
        // One-node machines often say -1: node 0 (as torch).
        Ok(n.max(0) as usize)
    }

    fn has_numa(&self) -> bool {
        self.host
            .list_dir(Path::new("/sys/devices/system/node"))
            .is_some()
    }

    /// The node's CPUs that rdrun may use (torch: `cpulist` ∩ the agent's affinity).
    fn node_cpus(&self, node: usize) -> Result<BTreeSet<usize>, String> {
        let allowed = self.allowed();
        if !self.has_numa() {
            return Ok(allowed);
        }
        let path = format!("/sys/devices/system/node/node{node}/cpulist");
        let text = self
            .read(&path)
            .map_err(|_| format!("could not determine the CPUs of NUMA node {node} ({path})"))?;
        let all = parse_cpu_list(&text).ok_or_else(|| format!("{path}: bad CPU list {text:?}"))?;
        Ok(all.intersection(&allowed).copied().collect())
    }

    fn list_file(&self, path: &str) -> Option<BTreeSet<usize>> {
        parse_cpu_list(&self.host.read_text(Path::new(path))?)
    }

    /// Representative (smallest) CPU of `cpu`'s physical core.
    fn core_of(&self, cpu: usize) -> usize {
        self.list_file(&format!(
            "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        ))
        .and_then(|s| s.first().copied())
        .unwrap_or(cpu)
    }

    /// Representative (smallest) CPU sharing `cpu`'s largest unified or data cache.
    fn cache_group_of(&self, cpu: usize) -> Result<usize, String> {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cache");
        let entries = self
            .host
            .list_dir(Path::new(&dir))
            .ok_or_else(|| format!("cannot read {dir}"))?;
        let mut best: Option<(u32, BTreeSet<usize>)> = None;
        for e in entries {
            if !e.starts_with("index")
                || !e[5..].bytes().all(|b| b.is_ascii_digit())
                || e.len() == 5
            {
                continue;
            }
            let base = format!("{dir}/{e}");
            let ty = self.read(&format!("{base}/type"))?;
            if !matches!(ty.trim(), "Unified" | "Data") {
                continue;
            }
            let level: u32 = self
                .read(&format!("{base}/level"))?
                .trim()
                .parse()
                .map_err(|_| format!("{base}/level: not a number"))?;
            if best.as_ref().is_some_and(|(l, _)| level <= *l) {
                continue;
            }
            let shared = self
                .list_file(&format!("{base}/shared_cpu_list"))
                .ok_or_else(|| format!("cannot read {base}/shared_cpu_list"))?;
            best = Some((level, shared));
        }
        best.and_then(|(_, s)| s.first().copied())
            .ok_or_else(|| format!("no unified or data cache listed in {dir}"))
    }

    fn socket_of_node(&self, node: usize) -> Result<Option<usize>, String> {
        let Some(cpu) = self.node_cpus(node)?.first().copied() else {
            return Ok(None);
        };
        let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id");
        let text = self
            .read(&path)
            .map_err(|_| format!("could not determine the socket of CPU {cpu}"))?;
        text.trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{path}: not a number"))
    }

    /// The set of the accelerator with index `device` and a note on why.
    fn for_device(
        &self,
        mode: NumaMode,
        device: usize,
        gpus: &[Accelerator],
    ) -> Result<(BTreeSet<usize>, String), String> {
        let acc = gpus.get(device).ok_or_else(|| {
            format!(
                "there are only {} visible accelerators (need one per local rank)",
                gpus.len()
            )
        })?;
        let node = self.numa_node_of(acc)?;
        let why = format!("NUMA node {node}, accelerator {device} at PCI {}", acc.pci);
        match mode {
            NumaMode::Node => Ok((self.node_cpus(node)?, why)),
            NumaMode::Socket => {
                if !self.has_numa() {
                    return Ok((self.node_cpus(node)?, why));
                }
                let socket = self
                    .socket_of_node(node)?
                    .ok_or_else(|| format!("NUMA node {node} has no CPU rdrun may use"))?;
                let possible = self.read("/sys/devices/system/node/possible")?;
                let nodes = parse_cpu_list(&possible)
                    .ok_or_else(|| format!("/sys/devices/system/node/possible: {possible:?}"))?;
                let mut set = BTreeSet::new();
                let mut names = Vec::new();
                for n in nodes {
                    if self.socket_of_node(n)? == Some(socket) {
                        set.extend(self.node_cpus(n)?);
                        names.push(n.to_string());
                    }
                }
                Ok((
                    set,
                    format!("socket {socket} (NUMA nodes {}), {why}", names.join(",")),
                ))
            }
            NumaMode::Exclusive | NumaMode::CoreComplex => {
                // Devices on the same node, by index; this one's position among them.
                let mut on_node = Vec::new();
                for (i, g) in gpus.iter().enumerate() {
                    if self.numa_node_of(g)? == node {
                        on_node.push(i);
                    }
                }
                let pos = on_node.iter().position(|&i| i == device).unwrap_or(0);
                let cpus = self.node_cpus(node)?;
                if mode == NumaMode::Exclusive {
                    let mut cores: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
                    for c in cpus {
                        cores.entry(self.core_of(c)).or_default().insert(c);
                    }
                    let groups: Vec<BTreeSet<usize>> = cores.into_values().collect();
                    let (start, end) = split_range(groups.len(), on_node.len(), pos).ok_or_else(|| {
                        format!(
                            "there are only {} physical cores on NUMA node {node}, but {} accelerators on it",
                            groups.len(),
                            on_node.len()
                        )
                    })?;
                    let set = groups[start..end].iter().flatten().copied().collect();
                    Ok((
                        set,
                        format!(
                            "cores {start}..{end} of {} on {why}, shared by {} accelerators",
                            groups.len(),
                            on_node.len()
                        ),
                    ))
                } else {
                    let mut caches: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
                    for c in cpus {
                        caches.entry(self.cache_group_of(c)?).or_default().insert(c);
                    }
                    let mut groups: Vec<(usize, BTreeSet<usize>)> = caches.into_iter().collect();
                    if groups.is_empty() {
                        return Err(format!("NUMA node {node} has no CPU rdrun may use"));
                    }
                    // torch: caches with more usable CPUs first, then by lowest CPU.
                    groups.sort_by_key(|(k, s)| (std::cmp::Reverse(s.len()), *k));
                    let idx = pos % groups.len();
                    Ok((
                        groups[idx].1.clone(),
                        format!("core complex {idx} of {} on {why}", groups.len()),
                    ))
                }
            }
        }
    }

    /// `--cpu-binding`: rdrun's affinity mask in `nproc` contiguous shares, by physical core
    /// (hyper-thread siblings stay together) when there are at least as many cores as ranks,
    /// else by logical CPU; the first `len % nproc` shares get one more.
    fn shares(&self, nproc: usize) -> Result<Vec<Vec<usize>>, String> {
        let allowed = self.allowed();
        let mut cores: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &c in &allowed {
            cores.entry(self.core_of(c)).or_default().push(c);
        }
        let mut groups: Vec<Vec<usize>> = cores.into_values().collect();
        if groups.len() < nproc {
            groups = allowed.iter().map(|&c| vec![c]).collect();
        }
        if groups.len() < nproc {
            return Err(format!(
                "{} CPUs in rdrun's affinity mask cannot give each of {nproc} workers its own",
                allowed.len()
            ));
        }
        Ok((0..nproc)
            .map(|r| {
                let (s, e) = split_range(groups.len(), nproc, r).expect("checked above");
                let mut v: Vec<usize> = groups[s..e].iter().flatten().copied().collect();
                v.sort_unstable();
                v
            })
            .collect())
    }
}

/// torch's even split of `items` among `parts`: part `i`'s `[start, end)`, the first
/// `items % parts` parts one longer; `None` when some part would be empty.
fn split_range(items: usize, parts: usize, i: usize) -> Option<(usize, usize)> {
    let per = items.checked_div(parts)?;
    if per < 1 {
        return None;
    }
    let extra = items % parts;
    let start = i * per + i.min(extra);
    Some((start, start + per + usize::from(i < extra)))
}

/// `0-2,4,6-7` (sysfs list format) → the set; `None` when malformed. Empty text = empty set.
pub fn parse_cpu_list(text: &str) -> Option<BTreeSet<usize>> {
    let mut out = BTreeSet::new();
    for part in text
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 20 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out)
}

/// The set as a sysfs/`numactl` list (`0-2,4`), for messages.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
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
}
