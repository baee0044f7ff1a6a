//! Reading what a failed run printed: a Python traceback's exception type and frames (rank
//! prefixes of torch.distributed's exception hook removed), and a stop verdict line inside
//! another node's close reason. Pure text functions: the failure report, the stop verdict
//! (`nodes/stop_verdict.rs`) and the CI outputs (`ci/`) read failures through them.

/// The exception type and innermost frame of a Python traceback (`Traceback (most recent call
/// last):`, `  File "x.py", line 88, in f`, ..., `ValueError: msg`); `None` when the lines hold
/// no frame or no exception line. For a chained exception the last traceback is the one that
/// ended the process, so the last frame line and the last exception line are taken.
pub fn parse_traceback(lines: &[String]) -> Option<(String, String, u32)> {
    let frame = lines.iter().rev().find_map(|l| frame_of(unprefixed(l)))?;
    let kind = lines
        .iter()
        .rev()
        .find_map(|l| exception_of(unprefixed(l)))?;
    Some((kind, frame.0, frame.1))
}

/// Every frame of a traceback, outermost first (`ci/` looks for the innermost one in user
/// code).
pub(in crate::supervisor) fn frames(lines: &[String]) -> Vec<(String, u32)> {
    lines
        .iter()
        .filter_map(|l| frame_of(unprefixed(l)))
        .collect()
}

/// A line without the `[rank3]: ` that torch.distributed's exception hook puts before every
/// line of a traceback once a process group is up (without this, every DDP exception would
/// read as just `exit code 1`).
pub(in crate::supervisor) fn unprefixed(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("[rank") else {
        return line;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match rest[digits..].strip_prefix("]: ") {
        Some(after) if digits > 0 => after,
        _ => line,
    }
}

/// `  File "x.py", line 88, in f` → (`x.py`, 88).
fn frame_of(line: &str) -> Option<(String, u32)> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once("\", line ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((file.to_string(), digits.parse().ok()?))
}

/// `ValueError: msg`, `KeyboardInterrupt`, `torch.OutOfMemoryError: ...` → the type; `None` for
/// an indented line, a traceback header or chaining text.
fn exception_of(line: &str) -> Option<String> {
    if line.is_empty() || line.starts_with(char::is_whitespace) || line.starts_with("Traceback") {
        return None;
    }
    let head = line.split_once(':').map_or(line, |(h, _)| h).trim_end();
    let is_name = !head.is_empty()
        && head
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c == '_' || c.is_alphanumeric()));
    is_name.then(|| head.to_string())
}

/// How a verdict line begins and ends (`nodes::stop_verdict::SameFailure::verdict`).
pub(in crate::supervisor) const VERDICT_HEAD: &str = "the same failure ";
pub(in crate::supervisor) const NOT_RESTARTING: &str = "; not restarting";

/// The stop verdict another node closed the job with: its close reason (`the job failed on
/// <node>: <verdict>; its agent closed the rendezvous`) holds the verdict line. Then this node
/// exits "do not requeue" too, and its report's `verdict` is that line.
pub fn verdict_in(why: &str) -> Option<&str> {
    let start = why.find(VERDICT_HEAD)?;
    let len = why[start..].find(NOT_RESTARTING)? + NOT_RESTARTING.len();
    let line = &why[start..start + len];
    line.contains(" attempts in a row: ").then_some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prose line is not an exception type (the traceback cases: `stop_verdict_tests.rs`).
    #[test]
    fn prose_and_indented_lines_are_no_exception() {
        assert_eq!(
            exception_of("During handling of the above exception, x:"),
            None
        );
        assert_eq!(exception_of("  ValueError: indented"), None);
        assert_eq!(exception_of("ValueError: x"), Some("ValueError".into()));
    }
}
