//! The terminal console's writer, for what is rdrun's own rather than a worker's: rdrun's own
//! text (sent by [`crate::supervisor::output::own`]) and the waiting status line
//! ([`super::Console::status`]). Both end or erase what the workers'
//! output left open on the terminal first, so no line of rdrun's is ever glued onto a worker's
//! (see the console's module doc).

use std::io::Write;

use super::{Stream, Writer, ERASE};

/// The spinner's frames (those of the spinner library the status line used before the console
/// drew it).
const SPINNER: [&str; 8] = ["⠁", "⠂", "⠄", "⡀", "⢀", "⠠", "⠐", "⠈"];

impl Writer {
    /// rdrun's own `text` for `stream`: the status line erased and any open line of the
    /// terminal ended (a live bar erased) first; errors dropped.
    pub(super) fn own_text(&mut self, stream: Stream, text: &[u8]) {
        if self.term(stream) == self.term(Stream::Stderr) {
            self.erase_status();
        }
        self.end_open_lines(stream);
        self.write_plain(stream, text);
    }

    /// Ends the open line that `stream`'s text would otherwise be glued onto (on a shared
    /// terminal, that of either stream): a newline, or the erase of a live bar. The line's
    /// owner stays the owner: its continuation then starts a line of its own.
    fn end_open_lines(&mut self, stream: Stream) {
        for s in [Stream::Stdout, Stream::Stderr] {
            let i = s.index();
            if (s == stream || self.shared) && std::mem::take(&mut self.mid[i]) {
                let end: &[u8] = if std::mem::take(&mut self.mid_live[i]) {
                    ERASE
                } else {
                    b"\n"
                };
                self.write_plain(s, end);
            }
        }
    }

    /// A write of rdrun's own: not recorded as the workers' cursor, errors dropped (a broken
    /// stream is left alone).
    fn write_plain(&mut self, stream: Stream, bytes: &[u8]) {
        let i = stream.index();
        if bytes.is_empty() || self.is_broken[i] {
            return;
        }
        let w = &mut self.outs[i];
        let _ = w.write_all(bytes).and_then(|()| w.flush());
    }

    /// The status line's new text (`None`: erased for good).
    pub(super) fn set_status(&mut self, text: Option<String>) {
        self.status.text = text;
        match self.status.text.is_some() {
            true => self.draw_status(),
            false => self.erase_status(),
        }
    }

    /// Draws the status line in place, if the terminal's console is free: no worker line open,
    /// nothing held, no live bar (it is drawn again at the next update otherwise).
    fn draw_status(&mut self) {
        let Some(text) = self.status.text.clone() else {
            return;
        };
        let t = self.term(Stream::Stderr);
        let term = &self.terms[t];
        let busy = term.open.is_some() || !term.held.is_empty() || term.live.is_some();
        if !self.terminal || busy || self.is_broken[Stream::Stderr.index()] {
            return;
        }
        if !self.status.shown {
            // A worker's last partial line stays, ended; the status line gets a line of its own.
            self.end_open_lines(Stream::Stderr);
        }
        let frame = SPINNER[self.status.frame % SPINNER.len()];
        self.status.frame += 1;
        let mut line = format!("{frame} {text}");
        // Never wider than the terminal: a wrapped line could not be redrawn in place.
        if let Some(cols) = (self.columns)(Stream::Stderr) {
            if let Some((cut, _)) = line.char_indices().nth(cols.saturating_sub(1)) {
                line.truncate(cut);
            }
        }
        let bytes = [ERASE, line.as_bytes()].concat();
        self.write_plain(Stream::Stderr, &bytes);
        self.status.shown = true;
    }

    /// Erases the status line if it is on the terminal.
    pub(super) fn erase_status(&mut self) {
        if std::mem::take(&mut self.status.shown) {
            self.write_plain(Stream::Stderr, ERASE);
        }
    }
}
