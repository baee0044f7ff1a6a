//! One message for the console writer ([`Chunk`]): a run of whole lines, a prompt's open line or
//! its continuation, or a progress bar's new state, of one stream of one worker. Shared by the forwarders (`pump`), the writer
//! (`console`) and its collapse stage (`collapse`), so that neither of the last two imports the
//! other's file for it.

use super::own::Stream;

/// One message of one source (a stream of one worker) for the console.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chunk {
    pub source: u64,
    pub stream: Option<Stream>,
    /// The chunk begins with the rest of the line this source left open (`cont`).
    pub continues: bool,
    /// The rest of the open line, unprefixed, with its terminator when it ends here.
    pub cont: Vec<u8>,
    /// Written before `cont` when the writer had to end the open line meanwhile.
    pub prefix: Vec<u8>,
    /// Whole lines, each prefixed; or, when `open`, a new partial line (prefixed).
    pub body: Vec<u8>,
    /// The chunk ends mid-line: the line stays open.
    pub open: bool,
    /// The global rank of the worker (for `--output collapse`).
    pub rank: Option<usize>,
    /// Where each whole line of `body` ends (offsets), when `body` is whole lines; the collapse
    /// stage reads lines by these.
    pub line_ends: Vec<u32>,
    /// A progress bar update (`--progress`): the rank's `\r` line now reads this (no `\r`,
    /// unprefixed; `body` is empty). Whitespace only: the bar was cleared.
    pub bar: Option<Vec<u8>>,
    /// A line of `body` ends the rank's progress bar on this stream (the newline after `\r`
    /// segments): the stage forgets the bar before the lines are written.
    pub ends_bar: bool,
}

impl Chunk {
    pub(crate) fn len(&self) -> usize {
        self.cont.len()
            + self.prefix.len()
            + self.body.len()
            + self.bar.as_ref().map_or(0, Vec::len)
    }
}
