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
#[path = "numa_tests.rs"]
mod tests;
