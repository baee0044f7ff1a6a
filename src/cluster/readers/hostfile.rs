//! The hostfile reader (DeepSpeed and Open MPI dialects) and the `--include`/`--exclude`
//! resource filter.

#![allow(clippy::field_reassign_with_default)]

use super::*;

/// One parsed hostfile entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub host: String,
    pub slots: Option<usize>,
}

/// The union of DeepSpeed's `host slots=N` and Open MPI's dialects (`host`, `host slots=N`,
/// `host:N`, `max_slots` ignored, `#`/`//` comments); repeats merge in first-seen order (with a
/// note, since DeepSpeed rejects them).
pub fn parse_hostfile(path: &str, text: &str) -> R<(Vec<HostEntry>, Vec<String>)> {
    let mut out: Vec<HostEntry> = Vec::new();
    let mut notes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let line = line.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let bad = |what: &str| ClusterError(format!("{path}:{}: {what} in {raw:?}", i + 1));
        let (host, mut slots) = match first.rsplit_once(':') {
            Some((h, n))
                if !h.contains(':') && n.bytes().all(|b| b.is_ascii_digit()) && !n.is_empty() =>
            {
                (
                    h.to_string(),
                    Some(n.parse().map_err(|_| bad("bad slot count"))?),
                )
            }
            _ => (first.to_string(), None),
        };
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| bad("expected key=value"))?;
            match k {
                "slots" | "count" | "cpu" => {
                    slots = Some(v.parse().map_err(|_| bad("bad slot count"))?)
                }
                k if k.contains("max") => {}
                _ => return Err(bad(&format!("unknown key {k:?}"))),
            }
        }
        match out.iter_mut().find(|e| e.host == host) {
            Some(e) => {
                notes.push(format!(
                    "{path}: {host} listed more than once; slots merged"
                ));
                e.slots = match (e.slots, slots) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            None => out.push(HostEntry { host, slots }),
        }
    }
    if out.is_empty() {
        return fail(format!("hostfile {path} lists no hosts"));
    }
    Ok((out, notes))
}

/// The source of the devices a hostfile filter chose; `config` gives them to the workers as
/// CUDA_VISIBLE_DEVICES (DeepSpeed: slots are device indices).
pub const FILTER_DEVICES: &str = "slots kept by --include/--exclude";

/// A hostfile named by `--hostfile`, `RDRUN_HOSTFILE` or `OMPI_MCA_orte_default_hostfile`,
/// filtered by `--include`/`--exclude` (`flags`) with DeepSpeed's documented semantics.
pub fn hostfile(env: &dyn Env, host: &HostFacts<'_>, flags: &Fields) -> R<Option<Layer>> {
    let named = flags.hostfile.clone().or_else(|| {
        first(env, &["RDRUN_HOSTFILE", "OMPI_MCA_orte_default_hostfile"]).map(|(var, p)| Sourced {
            value: p,
            source: var,
        })
    });
    let Some(named) = named else {
        return Ok(None);
    };
    let text = (host.read_file)(&named.value)
        .map_err(|e| ClusterError(format!("hostfile {} ({}): {e}", named.value, named.source)))?;
    let (entries, notes) = parse_hostfile(&named.value, &text)?;
    let what = format!("hostfile {} ({})", named.value, named.source);
    let include = flags.include.as_ref().map(|s| s.value.as_str());
    let exclude = flags.exclude.as_ref().map(|s| s.value.as_str());
    // (host, slots chosen by a filter)
    let kept: Vec<(String, Option<Vec<usize>>)> = if include.is_some() || exclude.is_some() {
        let mut hosts = Vec::new();
        for e in &entries {
            let Some(n) = e.slots else {
                return fail(format!(
                    "--include/--exclude select slots, but {} has no slots=N in {what}",
                    e.host
                ));
            };
            hosts.push((e.host.clone(), n));
        }
        let chosen = resource_filter(&hosts, include, exclude)?;
        if chosen.is_empty() {
            return fail(format!("--include/--exclude leave no host of {what}"));
        }
        let all: Vec<String> = entries.iter().map(|e| e.host.clone()).collect();
        let names: Vec<String> = chosen.iter().map(|c| c.0.clone()).collect();
        if find_self(&names, host, &what).is_err() && find_self(&all, host, &what).is_ok() {
            let flag = if include.is_some() {
                "--include"
            } else {
                "--exclude"
            };
            return fail(format!(
                "this host ({}) is left out of {what} by {flag}: it takes no part in the job; start rdrun only on {}",
                host.hostname,
                names.join(", ")
            ));
        }
        chosen.into_iter().map(|(h, s)| (h, Some(s))).collect()
    } else {
        entries.iter().map(|e| (e.host.clone(), None)).collect()
    };
    let names: Vec<String> = kept.iter().map(|e| e.0.clone()).collect();
    let me = find_self(&names, host, &what)?;
    let mut f = Fields::default();
    f.mode = src(Mode::Node, what.clone());
    f.nnodes = src(
        NodeCount {
            min: names.len(),
            max: names.len(),
        },
        what.clone(),
    );
    f.node_rank = src(me, format!("position of this host in {what}"));
    let h0 = names[0].rsplit('@').next().unwrap_or(&names[0]);
    // MASTER_ADDR is a bare address, as torch's TCPStore takes it (`[fd00::1]` is `fd00::1`).
    let h0 = super::super::ip_literal(h0).map_or_else(|| h0.to_string(), |ip| ip.to_string());
    f.master_addr = src(h0, format!("first host of {what}"));
    f.master_port = src(29500, "torchrun default (hostfile)");
    f.backend = src("static".into(), "hostfile: fixed hosts");
    match &kept[me].1 {
        Some(slots) => {
            f.nproc = src(slots.len().to_string(), FILTER_DEVICES);
            f.devices = src(slots.iter().map(usize::to_string).collect(), FILTER_DEVICES);
        }
        None => {
            let mine = entries.iter().find(|e| e.host == names[me]);
            if let Some(s) = mine.and_then(|e| e.slots) {
                f.nproc = src(s.to_string(), format!("slots of this host in {what}"));
            }
        }
    }
    f.node_list = src(names, what);
    Ok(Some(Layer {
        name: "hostfile".into(),
        detail: named.value.clone(),
        fields: f,
        notes,
    }))
}

/// DeepSpeed's *documented* `-i/--include` and `-e/--exclude` semantics
/// (`parse_resource_filter`; its CLI deviates since PR #6530): `NAME[:SLOT[,SLOT…]]` specs joined
/// by `@`; include starts empty, exclude starts from every slot; an unknown host or slot is an
/// error; hosts left empty are dropped; hostfile order kept; slots merged and sorted.
pub fn resource_filter(
    hosts: &[(String, usize)],
    include: Option<&str>,
    exclude: Option<&str>,
) -> R<Vec<(String, Vec<usize>)>> {
    let spec = match (include, exclude) {
        (Some(_), Some(_)) => return fail("--include and --exclude are mutually exclusive".into()),
        (None, None) => {
            return Ok(hosts
                .iter()
                .map(|(h, n)| (h.clone(), (0..*n).collect()))
                .collect())
        }
        (Some(s), None) | (None, Some(s)) => s,
    };
    let including = include.is_some();
    let mut chosen: Vec<Vec<usize>> = hosts
        .iter()
        .map(|(_, n)| {
            if including {
                Vec::new()
            } else {
                (0..*n).collect()
            }
        })
        .collect();
    let flag = if including { "--include" } else { "--exclude" };
    for node in spec.split('@').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, slots) = match node.split_once(':') {
            Some((n, s)) => (n, Some(s)),
            None => (node, None),
        };
        let Some(i) = hosts.iter().position(|(h, _)| h == name) else {
            return fail(format!(
                "{flag} {spec:?}: host {name:?} is not in the hostfile"
            ));
        };
        let slots: Vec<usize> = match slots {
            None => (0..hosts[i].1).collect(),
            Some(s) => {
                let mut v = Vec::new();
                for t in s.split(',') {
                    let n: usize = t.trim().parse().map_err(|_| {
                        ClusterError(format!(
                            "{flag} {spec:?}: slot {t:?} of {name} is not a number"
                        ))
                    })?;
                    if n >= hosts[i].1 {
                        return fail(format!(
                            "{flag} {spec:?}: No slot '{n}' specified on host '{name}'"
                        ));
                    }
                    v.push(n);
                }
                v
            }
        };
        if including {
            chosen[i].extend(slots);
        } else if node.contains(':') {
            chosen[i].retain(|s| !slots.contains(s));
        } else {
            chosen[i].clear();
        }
    }
    Ok(hosts
        .iter()
        .zip(chosen)
        .filter_map(|((h, _), mut s)| {
            s.sort_unstable();
            s.dedup();
            (!s.is_empty()).then(|| (h.clone(), s))
        })
        .collect())
}
