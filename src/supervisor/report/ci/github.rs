//! GitHub Actions: the `::error` workflow command that annotates the failing rank's innermost
//! user frame, and the failure report as Markdown for `$GITHUB_STEP_SUMMARY`. Escaping follows
//! GitHub's workflow-command rules (`%`, CR and LF in the message; also `:` and `,` in a
//! property value).

use std::path::{Path, PathBuf};

use super::{GitHub, Run};

/// `::error file=train.py,line=88,title=rank 3%3A ValueError::ValueError: bad lr` (file and line
/// only when the root cause has a frame), with a final newline.
pub(super) fn annotation(run: &Run, gh: &GitHub) -> String {
    let mut props = Vec::new();
    if let Some((file, line)) = run.root_failure().and_then(|f| f.frame.as_ref()) {
        props.push(format!("file={}", property(&relative(file, gh))));
        props.push(format!("line={line}"));
    }
    props.push(format!("title={}", property(&run.title())));
    let mut message = run.reason();
    if let Some(v) = &run.verdict {
        message.push_str(&format!(
            "\nrdrun: {v} (exit {}: do not requeue)",
            run.exit_code
        ));
    }
    format!("::error {}::{}\n", props.join(","), data(&message))
}

/// A frame's file as the repository knows it: relative to `GITHUB_WORKSPACE` when it is inside
/// it (a relative path is taken from rdrun's working directory first); otherwise as written.
fn relative(file: &str, gh: &GitHub) -> String {
    let path = Path::new(file);
    let absolute: PathBuf = match (&gh.cwd, path.is_absolute()) {
        (Some(cwd), false) => cwd.join(path),
        _ => path.to_path_buf(),
    };
    gh.workspace
        .as_deref()
        .and_then(|ws| absolute.strip_prefix(ws).ok())
        .map_or_else(|| file.to_string(), |p| p.display().to_string())
}

/// A workflow command's message.
pub(super) fn data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value.
pub(super) fn property(text: &str) -> String {
    data(text).replace(':', "%3A").replace(',', "%2C")
}

/// The report as Markdown for the step summary: a heading with the exit status, the root cause,
/// a table of the failed ranks, the root cause's traceback and stderr, the verdict, restarts.
pub(super) fn summary(run: &Run) -> String {
    let mut out = format!(
        "### rdrun: {} failed (exit {})\n\n",
        inline(&run.job),
        run.exit_code
    );
    match run.root_failure() {
        Some(f) => {
            let at = f
                .frame
                .as_ref()
                .map(|(file, line)| format!(" at {}", inline(&format!("{file}:{line}"))))
                .unwrap_or_default();
            let host = run
                .host
                .as_deref()
                .map(|h| format!(", host {}", inline(h)))
                .unwrap_or_default();
            out.push_str(&format!(
                "**Root cause:** rank {} (local rank {}{host}, pid {}): {}{at}\n\n",
                f.rank,
                f.local_rank,
                f.pid,
                inline(&f.message)
            ));
        }
        None => out.push_str(&format!("**{}:** {}\n\n", run.title(), cell(&run.reason()))),
    }
    if let Some(h) = &run.hang {
        out.push_str(&format!("**Hang:** {}\n\n", cell(h)));
    }
    if !run.failures.is_empty() {
        out.push_str("| rank | local rank | pid | status | message |\n|---:|---:|---:|---|---|\n");
        for f in &run.failures {
            let stopped = if f.stopped_by_rdrun {
                " (stopped by rdrun)"
            } else {
                ""
            };
            out.push_str(&format!(
                "| {} | {} | {} | {}{stopped} | {} |\n",
                f.rank,
                f.local_rank,
                f.pid,
                f.status,
                cell(&f.message)
            ));
        }
        out.push('\n');
    }
    if let Some(f) = run.root_failure() {
        details(
            &mut out,
            &format!("Traceback of rank {}", f.rank),
            &f.traceback,
            true,
        );
        let tail = format!("Last stderr lines of rank {}", f.rank);
        details(&mut out, &tail, &f.stderr_tail, f.traceback.is_empty());
    }
    if let Some(v) = &run.verdict {
        out.push_str(&format!(
            "**Not restarted:** {} (exit {}: do not requeue)\n\n",
            cell(v),
            run.exit_code
        ));
    }
    if !run.restarts.is_empty() {
        out.push_str(&format!(
            "Restarts before this end: {} ({})\n\n",
            run.restarts.len(),
            cell(&run.restarts.join("; "))
        ));
    }
    out
}

/// A collapsible block of `lines` in a fenced text block (none when empty).
fn details(out: &mut String, title: &str, lines: &[String], open: bool) {
    if lines.is_empty() {
        return;
    }
    // A fence longer than any run of backticks in the text, so the text cannot close it.
    let longest = lines
        .iter()
        .flat_map(|l| l.split(|c| c != '`'))
        .map(str::len)
        .max()
        .unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    out.push_str(&format!(
        "<details{}><summary>{}</summary>\n\n{fence}text\n{}\n{fence}\n\n</details>\n\n",
        if open { " open" } else { "" },
        html(title),
        lines.join("\n")
    ));
}

/// Text in a table cell or a sentence: one line, no table or HTML syntax.
fn cell(text: &str) -> String {
    html(&text.replace(['\r', '\n'], " ")).replace('|', "\\|")
}

/// Inline code: backticks inside would end it early, so they become quotes.
fn inline(text: &str) -> String {
    format!("`{}`", text.replace(['\r', '\n'], " ").replace('`', "'"))
}

fn html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
