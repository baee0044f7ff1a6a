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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(input: &str) -> Vec<String> {
        expand(input).unwrap_or_else(|e| panic!("{input:?}: {e}"))
    }

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    /// Spec cluster.md §1.3, rows 1–33 (HEAD column), with the expected expansion.
    pub(crate) const VALID: &[(&str, &str)] = &[
        ("node[1-3]", "node1 node2 node3"),
        ("gnode[10,20,25,37]", "gnode10 gnode20 gnode25 gnode37"),
        (
            "tux[0-5,12,20-25]",
            "tux0 tux1 tux2 tux3 tux4 tux5 tux12 tux20 tux21 tux22 tux23 tux24 tux25",
        ),
        (
            "linux[0000-0003]",
            "linux0000 linux0001 linux0002 linux0003",
        ),
        ("node1,node[2-5,12]", "node1 node2 node3 node4 node5 node12"),
        ("prefix[01-03,7]", "prefix01 prefix02 prefix03 prefix7"),
        ("node[001-003,007]", "node001 node002 node003 node007"),
        ("host[8-11]", "host8 host9 host10 host11"),
        ("host[08-11]", "host08 host09 host10 host11"),
        ("host[8-011]", "host8 host9 host10 host11"),
        ("node[01-3]", "node01 node02 node03"),
        ("host[098-101]", "host098 host099 host100 host101"),
        ("nid[001234-001236]", "nid001234 nid001235 nid001236"),
        (
            "rack[1-2]-node[01-02]",
            "rack1-node01 rack1-node02 rack2-node01 rack2-node02",
        ),
        (
            "compute-[1-2]-[0-1]",
            "compute-1-0 compute-1-1 compute-2-0 compute-2-1",
        ),
        ("node[1-2][3-4]", "node13 node14 node23 node24"),
        ("node[1-2]-ib", "node1-ib node2-ib"),
        ("n[1-2].cluster.local", "n1.cluster.local n2.cluster.local"),
        ("a[1-2]b[3-4]c", "a1b3c a1b4c a2b3c a2b4c"),
        ("alpha,beta,gamma", "alpha beta gamma"),
        (
            "nodeA,nodeB[001,003],nodeC",
            "nodeA nodeB001 nodeB003 nodeC",
        ),
        ("linux[1,2]", "linux1 linux2"),
        (
            "jean-zay-ia[810,812-813]",
            "jean-zay-ia810 jean-zay-ia812 jean-zay-ia813",
        ),
        ("host-[001-002]", "host-001 host-002"),
        ("n", "n"),
        (
            "dgx-a100-[001-002],cpu[3,5]",
            "dgx-a100-001 dgx-a100-002 cpu3 cpu5",
        ),
        (
            "node[0,3-4,8],linux,linux[2,5],node[4,12,15],linux[8,23]",
            "node0 node3 node4 node8 linux linux2 linux5 node4 node12 node15 linux8 linux23",
        ),
        ("node[3,1-2]", "node3 node1 node2"),
        ("node[1-2],node[2-3]", "node1 node2 node2 node3"),
        ("node1 node2\tnode3", "node1 node2 node3"),
        (",node1,,node2,", "node1 node2"),
        ("[1,3-5]", "1 3 4 5"),
        ("node[7]", "node7"),
    ];

    /// Spec rows 34–36 plus the `{…}` functions and stray brackets.
    pub(crate) const INVALID: &[(&str, &str)] = &[
        ("node[3-1]", "backwards"),
        ("node[a-c]", "not N or N-M"),
        ("node[-1]", "not N or N-M"),
        ("node[1,,2]", "not N or N-M"),
        ("node[]", "empty brackets"),
        ("node[1-3", "without a matching ']'"),
        ("n[1-70000]", "too many hosts in range"),
        ("a[0-999999999].b[0-9]", "too many hosts in range"),
        ("feature{gpu}", "hostlist functions"),
        ("torus{pod}[1-2]", "hostlist functions"),
        ("node1-3]", "without a matching '['"),
        ("node[1[2]]", "nested"),
        ("a[0-60000][0-60000]", "more than"),
        ("node[99999999999999999999]", "too large"),
    ];

    #[test]
    fn spec_vectors_expand_as_slurm_head() {
        for (input, want) in VALID {
            assert_eq!(ok(input), words(want), "{input:?}");
        }
        assert_eq!(ok(""), Vec::<String>::new());
    }

    #[test]
    fn spec_invalid_vectors_are_one_line_errors() {
        for (input, needle) in INVALID {
            let e = expand(input).expect_err(input).to_string();
            assert!(e.contains(needle), "{input:?}: {e}");
            assert!(!e.contains('\n'), "{input:?}: {e}");
        }
    }

    #[test]
    fn limits_are_inclusive() {
        assert_eq!(ok("n[0-65535]").len(), 65536);
        assert!(expand("n[0-65536]").is_err());
    }

    #[test]
    fn run_length_vectors() {
        assert_eq!(expand_counts("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        assert_eq!(expand_counts("72(x2),36").unwrap(), vec![72, 72, 36]);
        assert_eq!(
            expand_counts("1,2,1(x3),3,2").unwrap(),
            vec![1, 2, 1, 1, 1, 3, 2]
        );
        assert_eq!(expand_counts("8(x4)").unwrap(), vec![8, 8, 8, 8]);
        assert_eq!(expand_counts("4").unwrap(), vec![4]);
        assert_eq!(expand_counts("2,2").unwrap(), vec![2, 2]);
        for bad in [
            "4(x)", "(x2)", "4(x2", "4(x0)", "", "a", "4(2)", "-1", "4(x2)x",
        ] {
            assert!(expand_counts(bad).is_err(), "{bad:?}");
        }
        let e = expand_counts_for("2(x3),1", 3, "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST")
            .unwrap_err();
        assert_eq!(
            e,
            "SLURM_TASKS_PER_NODE=2(x3),1 describes 4 nodes but SLURM_STEP_NODELIST holds 3"
        );
        assert_eq!(
            expand_counts_for("2(x3),1", 4, "A", "B").unwrap(),
            vec![2, 2, 2, 1]
        );
    }

    /// A generated hostlist item together with its expected expansion (an independent model:
    /// ranges are kept as numbers with widths, expanded by plain loops).
    #[derive(Debug, Clone)]
    struct GenItem {
        text: String,
        hosts: Vec<String>,
    }

    fn gen_range() -> impl Strategy<Value = (String, Vec<String>)> {
        (0u64..40, 0u64..6, 1usize..4, any::<bool>()).prop_map(|(lo, span, width, single)| {
            let lo_text = format!("{lo:0width$}");
            if single {
                (lo_text.clone(), vec![lo_text])
            } else {
                let hi = lo + span;
                let hosts = (lo..=hi).map(|n| format!("{n:0width$}")).collect();
                (format!("{lo_text}-{hi}"), hosts)
            }
        })
    }

    fn gen_group() -> impl Strategy<Value = (String, Vec<String>)> {
        prop::collection::vec(gen_range(), 1..4).prop_map(|rs| {
            let text = rs.iter().map(|r| r.0.clone()).collect::<Vec<_>>().join(",");
            let hosts = rs.into_iter().flat_map(|r| r.1).collect();
            (format!("[{text}]"), hosts)
        })
    }

    /// Items in the forms Slurm 22.05 also accepts: literals and `word[..]word[..]`, no suffix.
    fn gen_item() -> impl Strategy<Value = GenItem> {
        let literal = "[a-z][a-z0-9-]{0,6}".prop_map(|s| GenItem {
            text: s.clone(),
            hosts: vec![s],
        });
        let grouped =
            prop::collection::vec(("[a-z][a-z-]{0,4}", gen_group()), 1..3).prop_map(|parts| {
                let mut text = String::new();
                let mut hosts = vec![String::new()];
                for (word, (group, nums)) in parts {
                    text.push_str(&word);
                    text.push_str(&group);
                    hosts = hosts
                        .iter()
                        .flat_map(|h| {
                            let word = &word;
                            nums.iter().map(move |n| format!("{h}{word}{n}"))
                        })
                        .collect();
                }
                GenItem { text, hosts }
            });
        prop_oneof![literal, grouped]
    }

    pub(crate) fn gen_list() -> impl Strategy<Value = (String, Vec<String>)> {
        prop::collection::vec(
            (gen_item(), prop::sample::select(vec![",", " ", ",,"])),
            1..5,
        )
        .prop_map(|items| {
            let mut text = String::new();
            let mut hosts = Vec::new();
            for (i, (item, sep)) in items.into_iter().enumerate() {
                if i > 0 {
                    text.push_str(sep);
                }
                text.push_str(&item.text);
                hosts.extend(item.hosts);
            }
            (text, hosts)
        })
    }

    proptest! {
        #[test]
        fn generated_lists_expand_like_the_model((text, hosts) in gen_list()) {
            prop_assert_eq!(expand(&text).unwrap(), hosts);
        }

        #[test]
        fn expansion_of_plain_names_is_identity(names in prop::collection::vec("[a-z][a-z0-9.-]{0,8}", 0..8)) {
            prop_assert_eq!(expand(&names.join(",")).unwrap(), names);
        }

        #[test]
        fn arbitrary_input_never_panics(s in "[a-z0-9\\[\\]\\-,{} ]{0,24}") {
            let _ = expand(&s);
            let _ = expand_counts(&s);
        }

        #[test]
        fn run_length_round_trip(groups in prop::collection::vec((0u32..100, 1u64..5), 1..6)) {
            let text = groups.iter().map(|(c, r)| if *r == 1 { c.to_string() } else { format!("{c}(x{r})") })
                .collect::<Vec<_>>().join(",");
            let want: Vec<u32> = groups.iter().flat_map(|(c, r)| std::iter::repeat(*c).take(*r as usize)).collect();
            prop_assert_eq!(expand_counts(&text).unwrap(), want);
        }
    }

    /// Runs Slurm's own parser (`scontrol show hostnames`, 22.05 semantics) with a minimal
    /// slurm.conf in a temp dir; no controller is needed. `None` when scontrol is absent.
    fn scontrol(conf: &std::path::Path, list: &str) -> Option<Result<Vec<String>, String>> {
        let out = std::process::Command::new("scontrol")
            .args(["show", "hostnames", list])
            .env("SLURM_CONF", conf)
            .output();
        let out = match out {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("running scontrol: {e}"),
            Ok(o) => o,
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // 22.05 reports most errors as "Invalid hostlist" with status 0, and an over-long
        // expansion (a[0-60000][0-60000]) as no output at all.
        if out.status.success() && !stderr.contains("Invalid") && !stdout.trim().is_empty() {
            Some(Ok(stdout.lines().map(str::to_string).collect()))
        } else {
            Some(Err(format!("{}{}", stdout.trim(), stderr.trim())))
        }
    }

    /// A temp dir holding a 4-line slurm.conf, removed when dropped.
    fn temp_conf() -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("rdrun-hostlist-oracle-")
            .tempdir()
            .unwrap();
        std::fs::write(
            dir.path().join("slurm.conf"),
            "ClusterName=rdruntest\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=localhost Default=YES\n",
        )
        .unwrap();
        dir
    }

    /// Differential test against Slurm's parser: every spec vector and 300 generated lists.
    /// The known 22.05 differences (spec §1.3: suffixes, rows 17–19, and the missing `]` of
    /// row 35, which 22.05 turns into garbage) are checked as differences, so a newer scontrol
    /// that agrees with HEAD shows up as a failure to update rather than passing silently.
    #[test]
    fn differential_against_scontrol() {
        let conf = temp_conf();
        let path = conf.path().join("slurm.conf");
        if scontrol(&path, "node1").is_none() {
            eprintln!("SKIP differential_against_scontrol: scontrol not installed (scripts/ensure-deps.sh installs slurm-client)");
            return;
        }
        let only_head = ["node[1-2]-ib", "n[1-2].cluster.local", "a[1-2]b[3-4]c"];
        for (input, _) in VALID {
            let theirs = scontrol(&path, input).unwrap();
            if only_head.contains(input) {
                assert!(theirs.is_err(), "22.05 accepted {input:?}: {theirs:?}");
            } else {
                assert_eq!(theirs, Ok(ok(input)), "{input:?}");
            }
        }
        for (input, _) in INVALID {
            if input.contains('{')
                || ["node[1-3", "node1-3]", "node[99999999999999999999]"].contains(input)
            {
                // 22.05 passes `{…}` and a stray `]` through as literal names, mangles a
                // missing `]` and saturates an overlong number to u64::MAX; HEAD rejects the
                // missing `]`, and the others are rejected by rdrun's own rules.
                continue;
            }
            let theirs = scontrol(&path, input).unwrap();
            assert!(theirs.is_err(), "scontrol accepted {input:?}: {theirs:?}");
        }
        assert_eq!(
            scontrol(&path, "node[1-3").unwrap(),
            Ok(vec!["node]".to_string()])
        );
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 300,
            ..ProptestConfig::default()
        });
        runner
            .run(&gen_list(), |(text, hosts)| {
                let ours = expand(&text).unwrap();
                prop_assert_eq!(&ours, &hosts);
                prop_assert_eq!(scontrol(&path, &text).unwrap(), Ok(ours), "{}", text);
                Ok(())
            })
            .unwrap();
    }
}
