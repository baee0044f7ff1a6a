//! Line splitting of one worker stream into console segments.
//!
//! A line ends at `\n` (or `\r\n`). A lone `\r` also ends a console segment, written with its `\r`
//! and no added newline, so that progress bars (tqdm) still redraw in place. A line longer than
//! [`MAX_LINE`] (1 MiB) is emitted in pieces of that size, each written whole; on the console each
//! piece gets a newline (and the prefix); this bounds memory at about 1 MiB per stream. A final
//! line without newline at EOF is emitted, with a newline added on the console. The unfinished
//! line stays readable ([`Splitter::held`]) so that the pump can show a prompt before its line
//! ends; segments are still emitted whole, for the filtered logs and the stderr tail.

/// Longest piece of a line kept in memory before it is emitted in pieces.
pub const MAX_LINE: usize = 1 << 20;

/// How a segment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// `\n` or `\r\n`.
    Newline,
    /// A lone `\r` (progress bars).
    Return,
    /// The line reached [`MAX_LINE`] bytes; more of it follows.
    Cap,
    /// The stream ended without a final newline.
    Eof,
}

impl End {
    /// Whether the console needs an added `\n` after this segment.
    pub(crate) fn needs_newline(self) -> bool {
        matches!(self, End::Cap | End::Eof)
    }
}

/// Splits a byte stream into segments, holding at most `cap` bytes of an unfinished line.
#[derive(Debug)]
pub(crate) struct Splitter {
    buf: Vec<u8>,
    cap: usize,
}

impl Splitter {
    pub(crate) fn new(cap: usize) -> Self {
        Splitter {
            buf: Vec::new(),
            cap,
        }
    }

    /// Appends `data`; calls `emit(segment, end)` for every finished segment, `segment` including
    /// its terminator bytes as written.
    pub(crate) fn push(&mut self, data: &[u8], emit: &mut dyn FnMut(&[u8], End)) {
        // The held part has no terminator except maybe a final '\r' waiting for a possible '\n'.
        let mut from = self.buf.len().saturating_sub(1);
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(i) = self.buf[from..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map(|i| i + from)
        {
            let (end, kind) = if self.buf[i] == b'\n' {
                (i + 1, End::Newline)
            } else if i + 1 == self.buf.len() {
                break; // hold a final '\r' until we know whether '\n' follows
            } else if self.buf[i + 1] == b'\n' {
                (i + 2, End::Newline)
            } else {
                (i + 1, End::Return)
            };
            emit_capped(&self.buf[start..end], kind, self.cap, emit);
            start = end;
            from = end;
        }
        // A held final '\r' may still turn out to end the line: it does not count as content.
        let held_cr = usize::from(self.buf.last() == Some(&b'\r'));
        while self.buf.len() - start - held_cr > self.cap {
            emit(&self.buf[start..start + self.cap], End::Cap);
            start += self.cap;
        }
        self.buf.drain(..start);
    }

    /// The unfinished line held so far (it may end with a `\r` that waits for a possible `\n`).
    pub(crate) fn held(&self) -> &[u8] {
        &self.buf
    }

    /// Bytes of [`Splitter::held`] that are line content for sure (a final `\r` is not yet).
    pub(crate) fn held_len(&self) -> usize {
        self.buf.len() - usize::from(self.buf.last() == Some(&b'\r'))
    }

    /// The stream ended: emits what is held.
    pub(crate) fn finish(&mut self, emit: &mut dyn FnMut(&[u8], End)) {
        if !self.buf.is_empty() {
            let held = std::mem::take(&mut self.buf);
            emit_capped(&held, End::Eof, self.cap, emit);
        }
    }
}

/// Emits `seg`, first as pieces of `cap` content bytes while more than `cap` remain, so that a
/// terminator is never separated from the end of its line.
fn emit_capped(mut seg: &[u8], end: End, cap: usize, emit: &mut dyn FnMut(&[u8], End)) {
    while content(seg, end).len() > cap {
        emit(&seg[..cap], End::Cap);
        seg = &seg[cap..];
    }
    emit(seg, end);
}

/// A segment without its terminator bytes.
pub(crate) fn content(seg: &[u8], end: End) -> &[u8] {
    match end {
        End::Newline => seg
            .strip_suffix(b"\r\n")
            .or_else(|| seg.strip_suffix(b"\n"))
            .unwrap_or(seg),
        End::Return => seg.strip_suffix(b"\r").unwrap_or(seg),
        End::Cap | End::Eof => seg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], cap: usize) -> Vec<(String, End)> {
        let mut s = Splitter::new(cap);
        let mut got = Vec::new();
        let mut emit = |seg: &[u8], end: End| {
            got.push((String::from_utf8_lossy(seg).into_owned(), end));
        };
        for c in chunks {
            s.push(c, &mut emit);
        }
        s.finish(&mut emit);
        got
    }

    #[test]
    fn splitter_table() {
        use End::*;
        type Case<'a> = (Vec<&'a [u8]>, usize, Vec<(&'a str, End)>);
        let cases: Vec<Case> = vec![
            (
                vec![b"a\nb\n"],
                100,
                vec![("a\n", Newline), ("b\n", Newline)],
            ),
            (
                vec![b"ab", b"c\nd"],
                100,
                vec![("abc\n", Newline), ("d", Eof)],
            ),
            (
                vec![b"x\r\ny\r"],
                100,
                vec![("x\r\n", Newline), ("y\r", Eof)],
            ),
            (
                vec![b"x\r", b"\ny"],
                100,
                vec![("x\r\n", Newline), ("y", Eof)],
            ),
            (
                vec![b"\r 1%\r 2%", b"\r 3%\n"],
                100,
                vec![
                    ("\r", Return),
                    (" 1%\r", Return),
                    (" 2%\r", Return),
                    (" 3%\n", Newline),
                ],
            ),
            (
                vec![b"abcdefgh", b"ij\n"],
                4,
                vec![("abcd", Cap), ("efgh", Cap), ("ij\n", Newline)],
            ),
            (
                vec![b"abcdefghij\nk"],
                4,
                vec![("abcd", Cap), ("efgh", Cap), ("ij\n", Newline), ("k", Eof)],
            ),
            (vec![b"abcd"], 4, vec![("abcd", Eof)]),
            (vec![b"abcd", b"\r\n"], 4, vec![("abcd\r\n", Newline)]),
            (vec![b"abcd\r", b"\n"], 4, vec![("abcd\r\n", Newline)]),
            (
                vec![b"abcde\r", b"x"],
                4,
                vec![("abcd", Cap), ("e\r", Return), ("x", Eof)],
            ),
            (vec![b""], 4, vec![]),
            (vec![b"\n\n"], 4, vec![("\n", Newline), ("\n", Newline)]),
        ];
        for (chunks, cap, want) in cases {
            let want: Vec<(String, End)> =
                want.into_iter().map(|(s, e)| (s.to_string(), e)).collect();
            assert_eq!(split(&chunks, cap), want, "chunks {chunks:?}");
        }
    }

    #[test]
    fn splitter_holds_at_most_cap() {
        let mut s = Splitter::new(1000);
        let mut n = 0;
        for _ in 0..100 {
            s.push(&[b'x'; 333], &mut |seg, end| {
                assert!(seg.len() <= 1000);
                assert_eq!(end, End::Cap);
                n += seg.len();
            });
            assert!(s.buf.len() <= 1001);
        }
        s.finish(&mut |seg, _| n += seg.len());
        assert_eq!(n, 33_300);
    }

    fn segments(input: &[u8], cuts: &[usize], cap: usize) -> Vec<(Vec<u8>, End)> {
        let mut s = Splitter::new(cap);
        let mut got = Vec::new();
        let mut emit = |seg: &[u8], end: End| got.push((seg.to_vec(), end));
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut at = 0;
        for c in cuts.into_iter().chain([input.len()]) {
            s.push(&input[at..c], &mut emit);
            at = c;
        }
        s.finish(&mut emit);
        got
    }

    proptest::proptest! {
        /// Segments rebuild the input exactly, do not depend on how reads cut the stream,
        /// hold at most `cap` content bytes, and end where the line rules say.
        #[test]
        fn splitter_properties(
            input in proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'\n', b'\r']), 0..200),
            cuts in proptest::collection::vec(0usize..1000, 0..20),
            cap in 1usize..8,
        ) {
            let whole = segments(&input, &[], cap);
            let chunked = segments(&input, &cuts, cap);
            proptest::prop_assert_eq!(&whole, &chunked);
            let joined: Vec<u8> = whole.iter().flat_map(|(s, _)| s.clone()).collect();
            proptest::prop_assert_eq!(&joined, &input);
            for (i, (seg, end)) in whole.iter().enumerate() {
                let text = content(seg, *end);
                proptest::prop_assert!(text.len() <= cap);
                proptest::prop_assert!(!seg.is_empty());
                proptest::prop_assert!(!text.contains(&b'\n'));
                match end {
                    End::Newline => proptest::prop_assert!(seg.ends_with(b"\n")),
                    End::Return => proptest::prop_assert!(seg.ends_with(b"\r")),
                    End::Cap => proptest::prop_assert_eq!(text.len(), cap),
                    End::Eof => proptest::prop_assert_eq!(i, whole.len() - 1),
                }
                if *end != End::Eof {
                    proptest::prop_assert!(!text.contains(&b'\r') || *end == End::Cap);
                }
            }
        }
    }
}
