//! `--output collapse` (issue 29) with the real binary: 8 ranks print the same lines and a few
//! different ones; the console shows each shared line once with its ranks, every other line per
//! rank, nothing lost or repeated, each rank's lines in its order; the `--tee` log files stay
//! per rank and byte-exact.

use std::collections::BTreeSet;
use std::fs;

use crate::util::{Rdrun, TempDir};

const RANKS: usize = 8;

/// Each rank waits until all have started (so that shared lines fall in one window), then
/// prints: one shared line, one of its own, a line shared by half the ranks, the same line twice,
/// a shared stderr line, a last shared line.
const SCRIPT: &str = r#"
: > "$SYNC/ready.$RANK"
n=0
while [ "$(ls "$SYNC" | grep -c '^ready\.')" -lt 8 ] && [ $n -lt 3000 ]; do sleep 0.02; n=$((n+1)); done
echo starting
echo "rank $RANK has local data"
if [ "$RANK" -lt 4 ]; then echo "epoch 1 loss 0.53"; else echo "epoch 1 loss 0.54"; fi
echo tick
echo tick
echo "warning: same on stderr" >&2
echo done
"#;

fn printed(rank: usize) -> Vec<String> {
    let loss = if rank < 4 { "0.53" } else { "0.54" };
    [
        "starting".to_string(),
        format!("rank {rank} has local data"),
        format!("epoch 1 loss {loss}"),
        "tick".into(),
        "tick".into(),
        "done".into(),
    ]
    .to_vec()
}

/// The ranks a console line names and its text: `[0-3,5] text` or `[default2]:text`.
fn parse(line: &str) -> (BTreeSet<usize>, String) {
    if let Some(rest) = line.strip_prefix("[default") {
        let (r, text) = rest.split_once("]:").expect("tee prefix");
        return (BTreeSet::from([r.parse().expect("rank")]), text.to_string());
    }
    let (set, text) = line
        .strip_prefix('[')
        .and_then(|l| l.split_once("] "))
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    let mut ranks = BTreeSet::new();
    for part in set.split(',') {
        match part.split_once('-') {
            Some((a, b)) => ranks.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => {
                ranks.insert(part.parse().unwrap());
            }
        }
    }
    (ranks, text.to_string())
}

fn worker_lines(text: &str) -> Vec<&str> {
    // rdrun's own log lines start with their timestamp.
    text.lines().filter(|l| !l.starts_with("20")).collect()
}

#[test]
fn eight_ranks_same_lines_shown_once_logs_per_rank_exact() {
    let dir = TempDir::new("collapse8");
    let sync = dir.join("sync");
    let logs = dir.join("logs");
    fs::create_dir_all(&sync).expect("sync dir");
    let out = Rdrun::new()
        .args(["--standalone", "--nproc-per-node", "8", "--tee", "3"])
        // The window is a bound, not a wait: at 10 s, ranks descheduled on a loaded machine
        // still meet in it.
        .args(["--output", "collapse", "--output-window", "10", "--log-dir"])
        .arg(&logs)
        .args(["--no-python", "sh", "-c", SCRIPT])
        .env("SYNC", &sync)
        .timeout(std::time::Duration::from_secs(120))
        .run();
    out.assert_code(0);
    let mut got: Vec<&str> = worker_lines(&out.stdout);
    got.sort_unstable();
    let mut want = vec![
        "[0-7] starting".to_string(),
        "[0-3] epoch 1 loss 0.53".into(),
        "[4-7] epoch 1 loss 0.54".into(),
        "[0-7] tick".into(),
        "[0-7] tick".into(),
        "[0-7] done".into(),
    ];
    want.extend((0..RANKS).map(|r| format!("[default{r}]:rank {r} has local data")));
    want.sort_unstable();
    assert_eq!(got, want, "{out:?}");
    // Every rank's lines, read back from the console, in the order it printed them.
    let lines: Vec<(BTreeSet<usize>, String)> =
        worker_lines(&out.stdout).into_iter().map(parse).collect();
    for r in 0..RANKS {
        let seen: Vec<String> = lines
            .iter()
            .filter(|(ranks, _)| ranks.contains(&r))
            .map(|(_, t)| t.clone())
            .collect();
        assert_eq!(seen, printed(r), "rank {r}: {out:?}");
    }
    assert_eq!(
        worker_lines(&out.stderr),
        ["[0-7] warning: same on stderr"],
        "{out:?}"
    );
    // The log files: per rank, exactly the bytes written.
    let runs: Vec<_> = fs::read_dir(&logs).expect("log dir").flatten().collect();
    assert_eq!(runs.len(), 1, "one run directory");
    let attempt = runs[0].path().join("attempt_0");
    for r in 0..RANKS {
        let read = |f: &str| fs::read(attempt.join(r.to_string()).join(f)).expect(f);
        let mut want = printed(r).join("\n");
        want.push('\n');
        assert_eq!(
            String::from_utf8_lossy(&read("stdout.log")),
            want,
            "rank {r}"
        );
        assert_eq!(read("stderr.log"), b"warning: same on stderr\n", "rank {r}");
    }
}
