//! What the failure report takes from a worker's stderr: the last lines (as a terminal shows
//! them: a redrawn progress bar counts once) and the last Python traceback, chained exceptions
//! and torch's `[rankN]: ` prefixes included, with bounded memory.

use std::collections::VecDeque;

use super::lines::{content, End};

/// Number of stderr lines kept for the failure report.
pub const TAIL_LINES: usize = 20;
/// Longest stderr tail or traceback line kept (in bytes, before lossy UTF-8 decoding).
pub const KEPT_LINE_MAX: usize = 4096;
/// Lines kept from the start of a traceback when it is longer than [`TRACEBACK_MAX_LINES`].
const TRACEBACK_HEAD: usize = 40;
/// Most traceback lines kept (head + tail; the middle is replaced by one marker line).
pub const TRACEBACK_MAX_LINES: usize = 200;
/// A traceback is reported only if it ended at most this many stderr lines before EOF (teardown
/// warnings of torch often follow the traceback; an older, handled traceback is not the cause).
pub const TRACEBACK_RECENT_LINES: usize = 50;

/// What [`super::forward_until`] yields when both streams are closed.
#[derive(Debug, Clone, Default)]
pub struct OutputSummary {
    /// The last (up to [`TAIL_LINES`]) lines the worker wrote to stderr, as printed (lossy UTF-8,
    /// each cut at [`KEPT_LINE_MAX`] bytes).
    pub stderr_tail: Vec<String>,
    /// The last Python traceback on stderr, from `Traceback (most recent call last):` to the
    /// exception line (chained exceptions included), as printed (torch's `[rankN]: ` prefixes
    /// kept); `None` if there is none or it ended more than [`TRACEBACK_RECENT_LINES`] lines before
    /// EOF. At most [`TRACEBACK_MAX_LINES`] lines (the middle is elided with a marker line).
    pub traceback: Option<Vec<String>>,
}

fn kept_line(bytes: &[u8]) -> String {
    if bytes.len() <= KEPT_LINE_MAX {
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        format!(
            "{}… [{} bytes cut by rdrun]",
            String::from_utf8_lossy(&bytes[..KEPT_LINE_MAX]),
            bytes.len() - KEPT_LINE_MAX
        )
    }
}

/// Keeps the last stderr lines and the last Python traceback of one worker.
#[derive(Debug, Default)]
pub(crate) struct StderrTracker {
    tail: VecDeque<String>,
    /// What a terminal shows of the current line after a lone `\r` (the last redrawn segment).
    redrawn: Option<Vec<u8>>,
    tb: TracebackScanner,
}

impl StderrTracker {
    pub(crate) fn segment(&mut self, seg: &[u8], end: End) {
        let text = content(seg, end);
        match end {
            End::Return => self.redrawn = Some(text.to_vec()),
            End::Newline | End::Cap | End::Eof => {
                let line = match self.redrawn.take() {
                    Some(prev) if text.is_empty() => kept_line(&prev),
                    _ => kept_line(text),
                };
                self.line(line);
            }
        }
    }

    fn finish(&mut self) {
        if let Some(prev) = self.redrawn.take() {
            self.line(kept_line(&prev));
        }
    }

    fn line(&mut self, line: String) {
        self.tb.line(&line);
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    pub(crate) fn summary(mut self) -> OutputSummary {
        self.finish();
        OutputSummary {
            stderr_tail: self.tail.into_iter().collect(),
            traceback: self.tb.result(),
        }
    }
}

/// Lines of a traceback with bounded memory: the first lines, then the last ones.
#[derive(Debug, Default, Clone)]
struct BoundedLines {
    head: Vec<String>,
    tail: VecDeque<String>,
    omitted: usize,
}

impl BoundedLines {
    fn push(&mut self, line: String) {
        if self.head.len() < TRACEBACK_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == TRACEBACK_MAX_LINES - TRACEBACK_HEAD - 1 {
            self.tail.pop_front();
            self.omitted += 1;
        }
        self.tail.push_back(line);
    }

    fn to_vec(&self) -> Vec<String> {
        let mut v = self.head.clone();
        if self.omitted > 0 {
            v.push(format!("  ... [{} lines omitted by rdrun]", self.omitted));
        }
        v.extend(self.tail.iter().cloned());
        v
    }
}

#[derive(Debug, Default)]
enum TbState {
    #[default]
    Idle,
    /// Inside a traceback, before its exception line.
    Frames,
    /// Right after an exception line: a chained-exception separator may follow.
    After {
        pending: Vec<String>,
        saw_separator: bool,
    },
}

/// Finds Python tracebacks in stderr lines (with or without torch's `[rankN]: ` prefix).
#[derive(Debug, Default)]
struct TracebackScanner {
    state: TbState,
    current: BoundedLines,
    /// The last finished traceback and the number of lines seen after it.
    last: Option<(BoundedLines, usize)>,
}

const TB_START: &str = "Traceback (most recent call last):";
const TB_CHAIN: [&str; 2] = [
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
];

/// Strips torch's excepthook prefix `[rank<N>]: ` (spec §5.7), for detection only.
fn strip_rank_prefix(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("[rank") else {
        return line;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return line;
    }
    match rest[digits..].strip_prefix("]:") {
        Some(r) => r.strip_prefix(' ').unwrap_or(r),
        None => line,
    }
}

/// Python's position marker under a frame's source line (`~~~~^^^^^`), which starts at column 0
/// when the line shown is not the one the offsets belong to (a file changed after import, a
/// code object compiled under another file's name; issue 38 item 14): part of the frames, not
/// the exception line that ends the traceback.
fn is_marker(line: &str) -> bool {
    line.contains('^')
        && line
            .trim_end()
            .chars()
            .all(|c| matches!(c, '^' | '~' | ' '))
}

impl TracebackScanner {
    fn line(&mut self, raw: &str) {
        let line = strip_rank_prefix(raw);
        if let Some((_, after)) = &mut self.last {
            *after += 1;
        }
        let state = std::mem::take(&mut self.state);
        self.state = match state {
            TbState::Idle => {
                if line == TB_START {
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else {
                    TbState::Idle
                }
            }
            TbState::Frames => {
                if line == TB_START {
                    // A new traceback before the previous one ended (interleaved output).
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line.starts_with(' ') || line.starts_with('\t') || is_marker(line) {
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line.is_empty() {
                    TbState::Idle // not a traceback after all
                } else {
                    self.current.push(raw.to_string());
                    self.last = Some((self.current.clone(), 0));
                    TbState::After {
                        pending: Vec::new(),
                        saw_separator: false,
                    }
                }
            }
            TbState::After {
                mut pending,
                saw_separator,
            } => {
                if line.is_empty() && pending.len() < 3 {
                    pending.push(raw.to_string());
                    TbState::After {
                        pending,
                        saw_separator,
                    }
                } else if !saw_separator && TB_CHAIN.contains(&line) {
                    pending.push(raw.to_string());
                    TbState::After {
                        pending,
                        saw_separator: true,
                    }
                } else if saw_separator && line == TB_START {
                    // Chained exception: keep the whole chain as one traceback.
                    for p in pending {
                        self.current.push(p);
                    }
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line == TB_START {
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else {
                    TbState::Idle
                }
            }
        };
    }

    fn result(&self) -> Option<Vec<String>> {
        match &self.last {
            Some((lines, after)) if *after <= TRACEBACK_RECENT_LINES => Some(lines.to_vec()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::lines::{Splitter, MAX_LINE};
    use super::super::testutil::TB;
    use super::*;

    fn track(text: &str) -> OutputSummary {
        let mut t = StderrTracker::default();
        let mut s = Splitter::new(MAX_LINE);
        s.push(text.as_bytes(), &mut |seg, end| t.segment(seg, end));
        s.finish(&mut |seg, end| t.segment(seg, end));
        t.summary()
    }

    #[test]
    fn stderr_tail_keeps_last_lines() {
        let text: String = (0..30).map(|i| format!("line {i}\n")).collect::<String>() + "last";
        let s = track(&text);
        assert_eq!(s.stderr_tail.len(), TAIL_LINES);
        assert_eq!(s.stderr_tail[0], "line 11");
        assert_eq!(s.stderr_tail[TAIL_LINES - 1], "last");
        assert_eq!(s.traceback, None);
        // Progress bars: the tail keeps what the terminal shows.
        let s = track("\r 10%\r 50%\r100%\ndone\r\n");
        assert_eq!(s.stderr_tail, vec!["100%", "done"]);
        let s = track("a\r\r\n");
        assert_eq!(s.stderr_tail, vec!["a"]);
        let long = "y".repeat(KEPT_LINE_MAX + 10);
        let s = track(&long);
        assert!(s.stderr_tail[0].ends_with("… [10 bytes cut by rdrun]"));
    }

    #[test]
    fn traceback_detection() {
        let lines = |s: &str| -> Vec<String> { s.lines().map(String::from).collect() };
        // Plain, with output before and a little after.
        let s = track(&format!("starting\n{TB}warning: teardown\n"));
        assert_eq!(s.traceback, Some(lines(TB)));
        // With torch's excepthook prefix, kept as printed.
        let prefixed: String = TB.lines().map(|l| format!("[rank1]: {l}\n")).collect();
        let s = track(&prefixed);
        assert_eq!(s.traceback, Some(lines(&prefixed)));
        // Chained exceptions are one traceback.
        let chained = format!(
            "{}\nDuring handling of the above exception, another exception occurred:\n\n{}",
            "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\nKeyError: 'k'",
            TB
        );
        let s = track(&chained);
        assert_eq!(s.traceback, Some(lines(&chained)));
        // Two unrelated tracebacks: the last one.
        let s = track(&format!(
            "Traceback (most recent call last):\n  x\nOSError: e\nmore\n{TB}"
        ));
        assert_eq!(s.traceback, Some(lines(TB)));
        // A traceback long before the end is not the cause.
        let after: String = (0..=TRACEBACK_RECENT_LINES)
            .map(|i| format!("{i}\n"))
            .collect();
        assert_eq!(track(&format!("{TB}{after}")).traceback, None);
        // An unfinished traceback (worker killed while printing) is not reported.
        assert_eq!(
            track("Traceback (most recent call last):\n  File \"a\"\n").traceback,
            None
        );
        // Bounded: the head, a marker, the end.
        let frames: String = (0..1000).map(|i| format!("  frame {i}\n")).collect();
        let s = track(&format!("{TB_START}\n{frames}RecursionError: deep\n"));
        let tb = s.traceback.expect("traceback");
        assert_eq!(tb.len(), TRACEBACK_MAX_LINES);
        assert_eq!(tb[0], TB_START);
        assert_eq!(tb[TRACEBACK_HEAD], "  ... [803 lines omitted by rdrun]");
        assert_eq!(tb[TRACEBACK_MAX_LINES - 1], "RecursionError: deep");
        assert_eq!(strip_rank_prefix("[rank12]: x"), "x");
        // Issue 38 item 14: a position marker at column 0 is part of the frames (before, it
        // ended the traceback as if it were the exception line).
        let marker = "Traceback (most recent call last):\n  File \"t.py\", line 2, in f\n    zz = 1\n~~~~~~^^^^^\nKeyError: 'b'\n";
        assert_eq!(track(marker).traceback, Some(lines(marker)));
        let prefixed: String = marker.lines().map(|l| format!("[rank0]: {l}\n")).collect();
        assert_eq!(track(&prefixed).traceback, Some(lines(&prefixed)));
        assert!(!is_marker("KeyError: 'b'") && !is_marker("~~~") && is_marker("^"));
        assert_eq!(strip_rank_prefix("[rank]: x"), "[rank]: x");
    }
}
