//! Worker output through the real binary (it needs the supervisor): `--tee` with prefixes,
//! a rank filter and log files, prefix templates and a plain console, no lost last line when a
//! worker is killed, no temp dir left and `/dev/null` redirects, and ranks that never
//! interleave mid-line, also through the collapse stage.

use std::fs;

use super::{rdrun, Scratch};

fn sorted_lines(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text.lines().collect();
    v.sort();
    v
}

/// rdrun's own log lines (tracing) are not worker output.
fn worker_lines(text: &str) -> Vec<&str> {
    let mut v: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("WARN") && !l.contains("INFO") && !l.contains("ERROR"))
        .collect();
    v.sort();
    v
}

#[test]
fn cli_tee_prefix_rank_filter_and_files() {
    let s = Scratch::new("cli-tee");
    let dir = s.0.to_string_lossy().into_owned();
    let script = "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2";
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=3",
            "--tee=3",
            "--local-ranks-filter=0,2",
            "--log-dir",
            &dir,
            "--no-python",
            "sh",
            "-c",
            script,
        ],
        &[],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(
        sorted_lines(&r.stdout),
        vec!["[default0]:out0", "[default2]:out2"],
        "{r:?}"
    );
    assert_eq!(
        worker_lines(&r.stderr),
        vec!["[default0]:err0", "[default2]:err2"],
        "{r:?}"
    );
    let runs: Vec<_> = fs::read_dir(&s.0).expect("log dir").flatten().collect();
    assert_eq!(runs.len(), 1, "one run directory");
    let run_dir = runs[0].path();
    // Rank 1 is filtered from the console, not from its files.
    let read = |p: &str| fs::read_to_string(run_dir.join(p)).expect(p);
    assert_eq!(read("attempt_0/1/stdout.log"), "out1\n");
    assert_eq!(read("attempt_0/1/stderr.log"), "err1\n");
    assert_eq!(read("attempt_0/0/stdout.log"), "out0\n");
}

#[test]
fn cli_prefix_template_and_plain_console() {
    let s = Scratch::new("cli-template");
    let tmp = s.0.to_string_lossy().into_owned();
    let script = "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2";
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--tee=1",
            "--log-line-prefix-template=[${rank}|${role_name}]",
            "--no-python",
            "sh",
            "-c",
            script,
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    // stdout tee'd with the template; stderr not tee'd: unprefixed.
    assert_eq!(
        sorted_lines(&r.stdout),
        vec!["[0|default]out0", "[1|default]out1"],
        "{r:?}"
    );
    assert_eq!(worker_lines(&r.stderr), vec!["err0", "err1"], "{r:?}");
    // Tee'd logs without --log-dir repeat the console: nothing is left behind.
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
}

#[test]
fn cli_no_lost_last_line_when_worker_is_killed() {
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=1",
            "--no-python",
            "sh",
            "-c",
            "printf 'first\\nlast words'; kill -9 $$",
        ],
        &[],
    );
    assert_eq!(r.stdout, "first\nlast words\n", "{r:?}");
    assert_eq!((r.code, r.signal), (Some(128 + 9), None), "{r:?}");
}

#[test]
fn cli_no_temp_dir_left_and_dev_null() {
    let s = Scratch::new("cli-tmp");
    let tmp = s.0.to_string_lossy().into_owned();
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--no-python",
            "sh",
            "-c",
            "test -d \"$(dirname \"$TORCHELASTIC_ERROR_FILE\")\" && echo ok$LOCAL_RANK",
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(sorted_lines(&r.stdout), vec!["ok0", "ok1"], "{r:?}");
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
    // --log-dir /dev/null: empty error file, tee ignored (plain console).
    let r = rdrun(
        &[
            "--standalone",
            "--nproc_per_node=1",
            "--log-dir=/dev/null",
            "--tee=3",
            "--no-python",
            "sh",
            "-c",
            "echo \"ef=[$TORCHELASTIC_ERROR_FILE]\"",
        ],
        &[("TMPDIR", &tmp)],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(r.stdout, "ef=[]\n", "{r:?}");
    assert_eq!(
        fs::read_dir(&s.0).expect("tmp").count(),
        0,
        "left behind in TMPDIR"
    );
}

#[test]
fn cli_ranks_never_interleave_mid_line() {
    ranks_never_interleave(&[]);
}

/// The same through the collapse stage (issue 29; every line is one rank's).
#[test]
fn cli_ranks_never_interleave_mid_line_under_collapse() {
    ranks_never_interleave(&["--output", "collapse"]);
}

fn ranks_never_interleave(extra: &[&str]) {
    const LINES: usize = 200;
    let awk = format!(
        "BEGIN {{ x = \"x\"; while (length(x) < 10000) x = x x; \
         for (i = 0; i < {LINES}; i++) {{ s = sprintf(\"rank%d-%d-\", ENVIRON[\"LOCAL_RANK\"], i); \
         print s substr(x, 1, 9000 + i - length(s)) }} }}"
    );
    let mut args = vec!["--standalone", "--nproc_per_node=4"];
    args.extend_from_slice(extra);
    args.extend(["--no-python", "awk", &awk]);
    let r = rdrun(&args, &[]);
    assert_eq!(r.code, Some(0), "{:?}", r.stderr);
    crate::util::assert_burst_lines_whole(&r.stdout, 4, LINES);
}
