//! `--report-junit PATH`: the run as JUnit XML for the CI systems that read it (GitLab, Jenkins,
//! Buildkite). One test suite, the job; one test case per rank of this node's last attempt; a
//! rank that failed has a `<failure>` with its message, exception type and traceback, and its
//! last stderr lines as `<system-err>`. A run that failed before or beside its workers (a
//! launcher error, a lost rendezvous, a bad node, a signal) has a test case `rdrun` with an
//! `<error>`. Written on success too, so a CI never reads an earlier run's file as this one's.

use super::{Failed, Run};

pub(super) fn render(run: &Run) -> String {
    let classname = run.job.as_str();
    let mut cases = Vec::new();
    let mut failures = 0;
    let mut errors = 0;
    // Every rank of the last attempt, and any failed rank not in it (an earlier attempt's).
    let mut ranks = run.ranks.clone();
    for f in &run.failures {
        if !ranks.iter().any(|&(_, r)| r == f.rank) {
            ranks.push((f.local_rank, f.rank));
        }
    }
    ranks.sort_by_key(|&(local, rank)| (rank, local));
    for (local, rank) in ranks {
        let name = format!("rank {rank}");
        let open = format!(
            "    <testcase name=\"{}\" classname=\"{}\"",
            attr(&name),
            attr(classname)
        );
        match run.failures.iter().rev().find(|f| f.rank == rank) {
            Some(f) => {
                failures += 1;
                cases.push(format!("{open}>\n{}    </testcase>\n", failure(run, f)));
            }
            None => cases.push(format!(
                "{open}>\n      <system-out>local rank {local}</system-out>\n    </testcase>\n"
            )),
        }
    }
    let ranked_failure = run.root_failure().is_some();
    if run.exit_code != 0 && !ranked_failure {
        errors += 1;
        let message = run.reason();
        cases.push(format!(
            "    <testcase name=\"rdrun\" classname=\"{}\">\n      <error message=\"{}\" type=\"{}\">{}</error>\n    </testcase>\n",
            attr(classname),
            attr(&message),
            attr(run.kind.as_deref().unwrap_or("failure")),
            text(&message)
        ));
    } else if cases.is_empty() {
        // A success with no worker of its own (the job was over before this node joined).
        cases.push(format!(
            "    <testcase name=\"rdrun\" classname=\"{}\"/>\n",
            attr(classname)
        ));
    }
    let tests = cases.len();
    let host = run
        .host
        .as_deref()
        .map(|h| format!(" hostname=\"{}\"", attr(h)))
        .unwrap_or_default();
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <testsuites name=\"rdrun\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\">\n  \
         <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"0\"{host}>\n{}  \
         </testsuite>\n</testsuites>\n",
        attr(&format!("rdrun {}", run.job)),
        cases.concat()
    )
}

/// The `<failure>` (and `<system-err>`) of a failed rank.
fn failure(run: &Run, f: &Failed) -> String {
    let root = run.root_failure().is_some_and(|r| std::ptr::eq(r, f));
    let kind = if f.stopped_by_rdrun && !root {
        "stopped by rdrun".to_string()
    } else {
        f.exception.clone().unwrap_or_else(|| f.status.clone())
    };
    let mut body = String::new();
    if root {
        if let Some(h) = &run.hang {
            body.push_str(&format!("hang: {h}\n"));
        }
        if let Some(v) = &run.verdict {
            body.push_str(&format!("rdrun: {v}\n"));
        }
    }
    body.push_str(&format!("{} (pid {})\n", f.status, f.pid));
    if let Some((file, line)) = &f.frame {
        body.push_str(&format!("at {file}:{line}\n"));
    }
    for l in &f.traceback {
        body.push_str(l);
        body.push('\n');
    }
    let mut out = format!(
        "      <failure message=\"{}\" type=\"{}\">{}</failure>\n",
        attr(&f.message),
        attr(&kind),
        text(&body)
    );
    if !f.stderr_tail.is_empty() {
        out.push_str(&format!(
            "      <system-err>{}</system-err>\n",
            text(&(f.stderr_tail.join("\n") + "\n"))
        ));
    }
    out
}

/// Text content: `&`, `<`, `>` escaped; characters XML 1.0 cannot hold (a terminal's escape
/// sequences in stderr, NUL) become U+FFFD, so the file always parses.
pub(super) fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// An attribute value in double quotes (line breaks kept as character references).
fn attr(s: &str) -> String {
    text(s)
        .replace('"', "&quot;")
        .replace('\n', "&#10;")
        .replace('\r', "&#13;")
        .replace('\t', "&#9;")
}
