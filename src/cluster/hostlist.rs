//! Slurm's hostlist grammar (`node[01-03,7],rack[1-2]-gpu[1-2]`) and its `N(xM)` run-length lists
//! (`SLURM_TASKS_PER_NODE=2(x3),1`), parsed natively: rdrun never runs `scontrol` at run time.
//!
//! The grammar follows SchedMD's `src/common/hostlist.c` at HEAD (see the spec, cluster.md §1.2):
//! items are split on comma, space, tab and newline outside brackets; an item splits at its
//! *last* `[` and the first `]` after it; the prefix may hold further groups (expanded
//! recursively in Slurm's order: see [`expand_prefix`]); a suffix after `]` is accepted (Slurm ≥ 23.02.5);
//! the zero-padding width is the length of each range's low bound as written. Order and
//! duplicates are kept, because `SLURM_NODEID` indexes the unsorted expansion. `{…}` host
//! functions (client input only), unbalanced brackets and oversized ranges are errors.

use std::fmt;

/// Most hosts one `N-M` range may hold (Slurm's `MAX_RANGE`, "Too many hosts in range").
pub const MAX_RANGE: u64 = 64 * 1024;
/// Most hosts a prefix may expand to (Slurm's `MAX_PREFIX_CNT`, against `a[0-999999999].b[0-9]`).
pub const MAX_PREFIX_CNT: usize = 64 * 1024;
/// Most hosts one whole hostlist may expand to: a guard against `a[0-60000][0-60000]` taking
/// gigabytes; far above any real cluster.
pub const MAX_HOSTS: usize = 1 << 20;

/// Why a hostlist or run-length list was rejected; `Display` is a one-line message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostlistError {
    /// The whole input, for the message.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

impl fmt::Display for HostlistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid hostlist {:?}: {}", self.input, self.reason)
    }
}

impl std::error::Error for HostlistError {}

fn err(input: &str, reason: impl Into<String>) -> HostlistError {
    HostlistError {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Expands a Slurm hostlist into host names, in order, duplicates kept.
pub fn expand(input: &str) -> Result<Vec<String>, HostlistError> {
    if let Some(c) = input.chars().find(|c| *c == '{' || *c == '}') {
        return Err(err(
            input,
            format!("'{c}': hostlist functions like feature{{x}} are expanded by slurmctld only and never appear in a job's environment"),
        ));
    }
    let mut out = Vec::new();
    for item in split_items(input)? {
        expand_item(input, item, &mut out)?;
        if out.len() > MAX_HOSTS {
            return Err(err(
                input,
                format!("expands to more than {MAX_HOSTS} hosts"),
            ));
        }
    }
    Ok(out)
}

/// Splits on separators outside brackets, skipping empty items; checks bracket balance.
fn split_items(input: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in input.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(err(input, format!("nested '[' at byte {i}")));
                }
                depth = 1;
            }
            ']' => {
                if depth == 0 {
                    return Err(err(
                        input,
                        format!("']' at byte {i} without a matching '['"),
                    ));
                }
                depth = 0;
            }
            ',' | ' ' | '\t' | '\n' | '\r' if depth == 0 => {
                if start < i {
                    items.push(&input[start..i]);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(err(input, "'[' without a matching ']'"));
    }
    if start < input.len() {
        items.push(&input[start..]);
    }
    Ok(items)
}

/// Expands one item (no separators outside brackets, brackets balanced) onto `out`.
fn expand_item(input: &str, item: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    let Some(open) = item.rfind('[') else {
        out.push(item.to_string());
        return Ok(());
    };
    // Balanced and not nested, so the first ']' after the last '[' closes it.
    let close = open + item[open..].find(']').expect("balanced brackets");
    let (prefix, ranges, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let prefixes = expand_prefix(input, prefix)?;
    if prefixes.len() > MAX_PREFIX_CNT {
        return Err(err(
            input,
            format!("prefix {prefix:?} expands to more than {MAX_PREFIX_CNT} hosts"),
        ));
    }
    let numbers = parse_ranges(input, ranges)?;
    if prefixes.len().saturating_mul(numbers.len()) > MAX_HOSTS {
        return Err(err(
            input,
            format!("expands to more than {MAX_HOSTS} hosts"),
        ));
    }
    for p in &prefixes {
        for n in &numbers {
            out.push(format!("{p}{n}{suffix}"));
        }
    }
    Ok(())
}

/// The groups inside an item's prefix, in Slurm's order (`_push_range_list` peels the prefix's
/// *last* group as its outer loop and recurses into the rest): the prefix's last group varies
/// slowest and its first fastest, and the item's own final group (expanded by the caller) varies
/// fastest of all. With two groups that is "leftmost slowest" (`rack[1-2]-node[01-02]`); with
/// three, `a[1-2]b[3-4]c[5-6]` gives a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 …: b slowest, then a,
/// then c (checked against scontrol by the differential test in `difftest`).
fn expand_prefix(input: &str, prefix: &str) -> Result<Vec<String>, HostlistError> {
    let Some(open) = prefix.rfind('[') else {
        return Ok(vec![prefix.to_string()]);
    };
    let close = open + prefix[open..].find(']').expect("balanced brackets");
    let (head, ranges, tail) = (
        &prefix[..open],
        &prefix[open + 1..close],
        &prefix[close + 1..],
    );
    let heads = expand_prefix(input, head)?;
    let numbers = parse_ranges(input, ranges)?;
    if heads.len().saturating_mul(numbers.len()) > MAX_PREFIX_CNT {
        return Err(err(
            input,
            format!("prefix {prefix:?} expands to more than {MAX_PREFIX_CNT} hosts"),
        ));
    }
    let mut out = Vec::with_capacity(heads.len() * numbers.len());
    for n in &numbers {
        for h in &heads {
            out.push(format!("{h}{n}{tail}"));
        }
    }
    Ok(out)
}

/// `r(,r)*` with `r` = `N` or `N-M`; each number printed with the width of its low bound.
fn parse_ranges(input: &str, ranges: &str) -> Result<Vec<String>, HostlistError> {
    if ranges.is_empty() {
        return Err(err(input, "empty brackets '[]'"));
    }
    let mut out = Vec::new();
    for r in ranges.split(',') {
        let (lo_text, hi_text) = match r.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (r, r),
        };
        let number = |t: &str| -> Result<u64, HostlistError> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(
                    input,
                    format!("range {r:?} is not N or N-M with decimal N <= M"),
                ));
            }
            t.parse::<u64>()
                .map_err(|_| err(input, format!("number {t:?} in range {r:?} is too large")))
        };
        let (lo, hi) = (number(lo_text)?, number(hi_text)?);
        if lo > hi {
            return Err(err(input, format!("range {r:?} runs backwards")));
        }
        if hi - lo >= MAX_RANGE {
            return Err(err(
                input,
                format!("too many hosts in range {r:?} (at most {MAX_RANGE})"),
            ));
        }
        let width = lo_text.len();
        for n in lo..=hi {
            out.push(format!("{n:0width$}"));
        }
        if out.len() > MAX_HOSTS {
            return Err(err(
                input,
                format!("expands to more than {MAX_HOSTS} hosts"),
            ));
        }
    }
    Ok(out)
}

/// Expands an `N(xM)` run-length list (`SLURM_TASKS_PER_NODE`, `SLURM_JOB_CPUS_PER_NODE`,
/// `SLURM_STEP_TASKS_PER_NODE`): `2(x3),1` -> `[2, 2, 2, 1]`. Adjacent equal groups are fine;
/// `(x0)` and malformed groups are errors.
pub fn expand_counts(input: &str) -> Result<Vec<u32>, HostlistError> {
    let bad = |reason: String| HostlistError {
        input: input.to_string(),
        reason,
    };
    let mut out = Vec::new();
    for group in input.split(',') {
        let group = group.trim();
        let (count, reps) = match group.split_once('(') {
            None => (group, "1"),
            Some((count, rest)) => {
                let reps = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad(format!("group {group:?} is not COUNT or COUNT(xREPS)")))?;
                (count, reps)
            }
        };
        let num = |t: &str| -> Result<u64, String> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("group {group:?} is not COUNT or COUNT(xREPS)"));
            }
            t.parse::<u64>()
                .map_err(|_| format!("number {t:?} in group {group:?} is too large"))
        };
        let count = u32::try_from(num(count).map_err(bad)?)
            .map_err(|_| bad(format!("count in group {group:?} is too large")))?;
        let reps = num(reps).map_err(bad)?;
        if reps == 0 {
            return Err(bad(format!("group {group:?} repeats zero times")));
        }
        if out.len() as u64 + reps > MAX_HOSTS as u64 {
            return Err(bad(format!("expands to more than {MAX_HOSTS} entries")));
        }
        out.extend(std::iter::repeat(count).take(reps as usize));
    }
    Ok(out)
}

/// [`expand_counts`] checked against the node count of the list it describes.
pub fn expand_counts_for(
    input: &str,
    nodes: usize,
    var: &str,
    list_var: &str,
) -> Result<Vec<u32>, String> {
    let counts = expand_counts(input).map_err(|e| format!("{var}: {e}"))?;
    if counts.len() != nodes {
        return Err(format!(
            "{var}={input} describes {} nodes but {list_var} holds {nodes}",
            counts.len()
        ));
    }
    Ok(counts)
}

#[cfg(test)]
#[path = "hostlist_tests.rs"]
mod tests;
