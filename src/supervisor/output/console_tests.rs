//! Unit tests of `console.rs` (moved out so that the module fits in a head).

use super::*;
use std::sync::Mutex;

/// A writer that records bytes, or fails with `fail` once `fail_after` bytes were written.
#[derive(Clone, Default)]
struct Rec {
    bytes: Arc<Mutex<Vec<u8>>>,
    fail: Option<(usize, io::ErrorKind)>,
}
impl Write for Rec {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let mut v = self.bytes.lock().expect("lock");
        if let Some((after, kind)) = self.fail {
            if v.len() >= after {
                return Err(io::Error::from(kind));
            }
        }
        v.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Rec {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().expect("lock")).into_owned()
    }
}

fn writer(shared: bool, out: &Rec, err: &Rec) -> (Writer, Arc<Semaphore>) {
    let broken = Arc::new([watch::channel(false).0, watch::channel(false).0]);
    let w = Writer::new(
        [Box::new(out.clone()), Box::new(err.clone())],
        shared,
        broken,
    );
    (w, Arc::new(Semaphore::new(1 << 20)))
}

fn permit(s: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    Some(s.clone().try_acquire_owned().expect("permit"))
}

fn lines(source: u64, stream: Stream, body: &str) -> Chunk {
    Chunk {
        source,
        stream: Some(stream),
        body: body.into(),
        ..Chunk::default()
    }
}

fn partial(source: u64, stream: Stream, prefix: &str, text: &str) -> Chunk {
    Chunk {
        open: true,
        body: format!("{prefix}{text}").into(),
        ..lines(source, stream, "")
    }
}

fn cont(source: u64, stream: Stream, prefix: &str, rest: &str, open: bool) -> Chunk {
    Chunk {
        continues: true,
        cont: rest.into(),
        prefix: prefix.into(),
        open,
        ..lines(source, stream, "")
    }
}

#[test]
fn open_line_holds_others_until_it_ends() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(false, &out, &err);
    let t0 = Instant::now();
    w.accept(partial(1, Stdout, "[a]:", "Name? "), permit(&s), t0);
    // Another rank's line and a stderr line (its own terminal here).
    w.accept(lines(2, Stdout, "[b]:hello\n"), permit(&s), t0);
    w.accept(lines(3, Stderr, "warn\n"), permit(&s), t0);
    assert_eq!(out.text(), "[a]:Name? ");
    assert_eq!(err.text(), "warn\n");
    w.tick(t0 + Duration::from_millis(500));
    assert_eq!(out.text(), "[a]:Name? ");
    // The owner extends its line, then ends it: the held line follows.
    w.accept(cont(1, Stdout, "[a]:", "(y/n) ", true), permit(&s), t0);
    w.accept(cont(1, Stdout, "[a]:", "ok\n", false), permit(&s), t0);
    assert_eq!(out.text(), "[a]:Name? (y/n) ok\n[b]:hello\n");
    assert_eq!(w.deadline(), None);
}

#[test]
fn open_line_ended_after_the_hold() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(true, &out, &err);
    let t0 = Instant::now();
    w.accept(partial(1, Stdout, "", "(Pdb) "), permit(&s), t0);
    // Shared terminal: a stderr line waits too.
    w.accept(lines(2, Stderr, "[b]:late\n"), permit(&s), t0);
    assert_eq!((out.text().as_str(), err.text().as_str()), ("(Pdb) ", ""));
    assert_eq!(w.deadline(), Some(t0 + OPEN_LINE_HOLD));
    w.tick(t0 + OPEN_LINE_HOLD);
    assert_eq!(out.text(), "(Pdb) \n");
    assert_eq!(err.text(), "[b]:late\n");
    // The continuation starts a line of its own, with the prefix; a bare terminator is
    // dropped (the writer already ended the line).
    w.accept(cont(1, Stdout, "[a]:", "rest\n", false), permit(&s), t0);
    assert_eq!(out.text(), "(Pdb) \n[a]:rest\n");
    w.accept(partial(1, Stdout, "[a]:", "x"), permit(&s), t0);
    w.accept(lines(2, Stdout, "[b]:y\n"), permit(&s), t0);
    w.tick(t0 + OPEN_LINE_HOLD * 3);
    w.accept(cont(1, Stdout, "[a]:", "\n", false), permit(&s), t0);
    assert_eq!(out.text(), "(Pdb) \n[a]:rest\n[a]:x\n[b]:y\n");
}

/// A source whose open chunk and continuation were both held behind another's open line
/// gets them written together when that line ends, ahead of the chunks that were queued
/// between them; its later lines come after its continuation, not glued onto its open line
/// (issue 24: `@0:1:7383@0:1:7398:…`, the rest of 7383 later).
#[test]
fn held_open_line_and_its_rest_go_together() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(false, &out, &err);
    let t0 = Instant::now();
    w.accept(partial(1, Stdout, "", "T? "), permit(&s), t0);
    w.accept(partial(2, Stdout, "", "@0:7383"), permit(&s), t0);
    w.accept(lines(3, Stdout, "u1\n"), permit(&s), t0);
    w.accept(cont(2, Stdout, "", ":rest\n@0:7384\n", false), None, t0);
    w.accept(cont(1, Stdout, "", "yes\n", false), None, t0);
    w.accept(lines(2, Stdout, "@0:7385\n"), permit(&s), t0);
    w.accept(lines(3, Stdout, "u2\n"), permit(&s), t0);
    assert_eq!(
        out.text(),
        "T? yes\n@0:7383:rest\n@0:7384\nu1\n@0:7385\nu2\n"
    );
    assert_eq!(w.deadline(), None);
    // An open line made by a held chunk lets its owner's later direct chunks through in order.
    w.accept(partial(1, Stdout, "", "A"), permit(&s), t0);
    w.accept(partial(2, Stdout, "", "B"), permit(&s), t0);
    w.accept(lines(3, Stdout, "u3\n"), permit(&s), t0);
    w.accept(cont(1, Stdout, "", "a\n", false), None, t0);
    w.accept(cont(2, Stdout, "", "b\n", false), None, t0);
    assert_eq!(
        out.text(),
        "T? yes\n@0:7383:rest\n@0:7384\nu1\n@0:7385\nu2\nAa\nBb\nu3\n"
    );
}

fn ranked(rank: usize, stream: Stream, body: &str) -> Chunk {
    let mut ends = Vec::new();
    for (i, b) in body.bytes().enumerate() {
        if b == b'\n' {
            ends.push(i as u32 + 1);
        }
    }
    Chunk {
        rank: Some(rank),
        line_ends: ends,
        ..lines(10 + rank as u64, stream, body)
    }
}

#[test]
fn the_collapse_stage_keeps_at_most_half_the_budget() {
    assert_eq!(super::super::collapse::PENDING_CAP, CONSOLE_BUDGET / 2);
}

/// `--output collapse` is a stage of this writer: identical lines wait at most the window and
/// come out once; a prompt (open line) first makes everything pending go out, so a rank's
/// prompt never overtakes its lines; a flush waits for the pending lines.
#[test]
fn collapse_stage_in_the_writer() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(false, &out, &err);
    let t0 = Instant::now();
    let win = Duration::from_millis(500);
    w.set_collapse(Some((win, 4)), t0);
    for r in 0..3 {
        w.accept(ranked(r, Stdout, "step 1\n"), permit(&s), t0);
    }
    assert_eq!(out.text(), "", "held for the window");
    assert_eq!(w.deadline(), Some(t0 + win));
    let (ack, mut done) = oneshot::channel();
    w.flush_request(ack);
    assert!(
        done.try_recv().is_err(),
        "flush acked before pending lines went out"
    );
    w.tick(t0 + win);
    assert_eq!(out.text(), "[0-2] step 1\n");
    assert!(done.try_recv().is_ok());
    // A line from one rank, then its prompt: the line first, then the open prompt.
    w.accept(ranked(1, Stdout, "about to stop\n"), permit(&s), t0 + win);
    w.accept(partial(11, Stdout, "", "(Pdb) "), permit(&s), t0 + win);
    assert_eq!(out.text(), "[0-2] step 1\nabout to stop\n(Pdb) ");
    // Others' lines wait behind the open line as without collapse.
    w.accept(ranked(0, Stdout, "x\n"), permit(&s), t0 + win);
    w.accept(ranked(2, Stdout, "x\n"), permit(&s), t0 + win);
    w.tick(t0 + win * 2);
    assert_eq!(out.text(), "[0-2] step 1\nabout to stop\n(Pdb) ");
    w.accept(cont(11, Stdout, "", "c\n", false), None, t0 + win * 2);
    assert_eq!(
        out.text(),
        "[0-2] step 1\nabout to stop\n(Pdb) c\n[0,2] x\n"
    );
    assert_eq!(s.available_permits(), 1 << 20, "permits returned");
    // Turned off: nothing pending is lost.
    w.accept(ranked(3, Stdout, "last\n"), permit(&s), t0 + win * 2);
    w.set_collapse(None, t0 + win * 2);
    assert!(out.text().ends_with("x\nlast\n"), "{}", out.text());
}

fn bar_update(rank: usize, stream: Stream, text: &str) -> Chunk {
    Chunk {
        rank: Some(rank),
        bar: Some(text.into()),
        ..lines(10 + rank as u64, stream, "")
    }
}

/// `--progress` on a terminal: one live line for the ranks' bars, erased before any other
/// write and drawn again once due; never drawn into an open prompt; a rank's final line
/// ends its bar; at the end each bar left is a line of its own.
#[test]
fn progress_stage_draws_one_live_line() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(true, &out, &err);
    let t0 = Instant::now();
    w.set_progress([None, Some((true, Duration::from_secs(5)))], t0);
    for (r, p) in [(0, "50%|a"), (1, "40%|b"), (2, "45%|c")] {
        w.accept(bar_update(r, Stderr, p), permit(&s), t0);
    }
    // The first update draws at once; the next two changed it within 100 ms.
    assert_eq!(err.text(), "\r50%|a\x1b[K");
    assert_eq!(w.deadline(), Some(t0 + Duration::from_millis(100)));
    w.tick(t0 + Duration::from_millis(100));
    assert_eq!(
        err.text(),
        "\r50%|a\x1b[K\r[0-2] 40%|b (slowest rank 1; 40-50%)\x1b[K"
    );
    err.bytes.lock().expect("lock").clear();
    // A line on the same terminal (stdout: shared) erases the bar first; it comes back.
    let t1 = t0 + Duration::from_millis(150);
    w.accept(ranked(3, Stdout, "hello\n"), permit(&s), t1);
    assert_eq!(err.text(), "\r\x1b[K");
    assert_eq!(out.text(), "hello\n");
    w.tick(t0 + Duration::from_millis(200));
    assert_eq!(
        err.text(),
        "\r\x1b[K\r[0-2] 40%|b (slowest rank 1; 40-50%)\x1b[K"
    );
    err.bytes.lock().expect("lock").clear();
    // A prompt: the bar is erased and not drawn into it, whatever changes.
    let t2 = t0 + Duration::from_millis(300);
    w.accept(partial(13, Stdout, "", "(Pdb) "), permit(&s), t2);
    w.accept(bar_update(1, Stderr, "41%|b"), permit(&s), t2);
    w.tick(t2 + Duration::from_millis(500));
    assert_eq!(err.text(), "\r\x1b[K");
    assert!(
        w.deadline().is_none(),
        "no busy wait while the prompt is open"
    );
    w.accept(
        cont(13, Stdout, "", "c\n", false),
        None,
        t2 + Duration::from_millis(600),
    );
    assert!(err
        .text()
        .ends_with("\r[0-2] 41%|b (slowest rank 1; 41-50%)\x1b[K"));
    err.bytes.lock().expect("lock").clear();
    // Rank 1's final line ends its bar (erase, the line, the bar of the others).
    let t3 = t0 + Duration::from_secs(2);
    let mut fin = ranked(1, Stderr, "100%|b\n");
    fin.ends_bar = true;
    w.accept(fin, permit(&s), t3);
    assert_eq!(
        err.text(),
        "\r\x1b[K100%|b\n\r[0,2] 45%|c (slowest rank 2; 45-50%)\x1b[K"
    );
    err.bytes.lock().expect("lock").clear();
    // The end: the live line erased, the bars left written as lines.
    w.close();
    assert_eq!(err.text(), "\r\x1b[K50%|a\n45%|c\n");
    assert_eq!(s.available_permits(), 1 << 20, "permits returned");
}

/// `--progress` on a pipe: an ordinary line at most once per interval.
#[test]
fn progress_stage_on_a_pipe() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(false, &out, &err);
    let t0 = Instant::now();
    let iv = Duration::from_secs(1);
    w.set_progress([None, Some((false, iv))], t0);
    let mut t = t0;
    for i in 0..250u32 {
        for r in 0..2 {
            let text = format!("{}%|", i * 100 / 250 + r);
            w.accept(bar_update(r as usize, Stderr, &text), permit(&s), t);
        }
        if w.deadline().is_some_and(|d| d <= t) {
            w.tick(t);
        }
        t += Duration::from_millis(10);
    }
    // At t0 only rank 0's first update had come (its bar alone, as written); at 1 s and
    // 2 s rank 0 had just moved to the value rank 1 already had.
    assert_eq!(
        err.text(),
        "0%|\n[0-1] 40%| (all at 40%)\n[0-1] 80%| (all at 80%)\n"
    );
    assert!(!err.text().contains('\r'));
}

#[test]
fn flush_waits_for_held_chunks() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(false, &out, &err);
    let t0 = Instant::now();
    w.accept(partial(1, Stdout, "", "p"), permit(&s), t0);
    w.accept(lines(2, Stdout, "b\n"), permit(&s), t0);
    let (ack, mut done) = oneshot::channel();
    w.flush_request(ack);
    assert!(
        done.try_recv().is_err(),
        "acked before the held line was written"
    );
    w.accept(cont(1, Stdout, "", "\n", false), permit(&s), t0);
    assert!(done.try_recv().is_ok());
    assert_eq!(out.text(), "p\nb\n");
    // A flush with nothing held is acked at once.
    let (ack, mut done) = oneshot::channel();
    w.flush_request(ack);
    assert!(done.try_recv().is_ok());
}

#[test]
fn write_errors_never_panic() {
    use Stream::*;
    // EPIPE on stdout: marked broken, nothing more tried there; stderr goes on.
    let out = Rec {
        fail: Some((3, io::ErrorKind::BrokenPipe)),
        ..Rec::default()
    };
    let err = Rec {
        fail: Some((0, io::ErrorKind::StorageFull)),
        ..Rec::default()
    };
    let (mut w, s) = writer(false, &out, &err);
    let broken = w.broken[0].subscribe();
    let t0 = Instant::now();
    w.accept(lines(1, Stdout, "ab\n"), permit(&s), t0);
    assert!(!*broken.borrow());
    w.accept(partial(1, Stdout, "", "open"), permit(&s), t0);
    assert!(*broken.borrow());
    // The dead stream's open line holds nobody back.
    w.accept(lines(2, Stdout, "c\n"), permit(&s), t0);
    w.tick(t0);
    assert_eq!(w.deadline(), None);
    assert_eq!(out.text(), "ab\n");
    // ENOSPC: dropped, not broken.
    w.accept(lines(1, Stderr, "e\n"), permit(&s), t0);
    assert!(!*w.broken[1].subscribe().borrow());
    assert_eq!(s.available_permits(), 1 << 20, "permits returned");
}

/// The terminal's console: rdrun's own text ends a worker's open line at once (no hold), the
/// line's rest then starts a line of its own with its prefix; the other source still waits.
#[test]
fn own_text_ends_an_open_line_first() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(true, &out, &err);
    w.terminal = true;
    let t0 = Instant::now();
    w.accept(partial(1, Stderr, "[a]:", "Name? "), permit(&s), t0);
    w.accept(lines(2, Stdout, "[b]:held\n"), permit(&s), t0);
    w.own_text(Stderr, b"rdrun: a log line\n");
    assert_eq!(err.text(), "[a]:Name? \nrdrun: a log line\n");
    assert_eq!(
        out.text(),
        "",
        "the other source waits for the line's owner"
    );
    w.accept(cont(1, Stderr, "[a]:", "bob\n", false), None, t0);
    assert_eq!(err.text(), "[a]:Name? \nrdrun: a log line\n[a]:bob\n");
    assert_eq!(out.text(), "[b]:held\n");
    // Nothing open: own text goes as it is.
    w.own_text(Stdout, b"done\n");
    assert_eq!(out.text(), "[b]:held\ndone\n");
}

/// The status line: drawn in place while the terminal is free, erased before worker output
/// and when the wait ends, not drawn into a worker's open line.
#[test]
fn status_line_is_the_consoles_own_live_line() {
    use Stream::*;
    let (out, err) = (Rec::default(), Rec::default());
    let (mut w, s) = writer(true, &out, &err);
    w.terminal = true;
    let t0 = Instant::now();
    let e = |s: &str| s.replace("\r\x1b[K", "<E>");
    w.set_status(Some("waiting 1s".into()));
    w.set_status(Some("waiting 2s".into()));
    assert_eq!(e(&err.text()), "<E>⠁ waiting 1s<E>⠂ waiting 2s");
    w.accept(lines(1, Stdout, "[a]:hello\n"), permit(&s), t0);
    assert_eq!(e(&err.text()), "<E>⠁ waiting 1s<E>⠂ waiting 2s<E>");
    assert_eq!(out.text(), "[a]:hello\n");
    w.accept(partial(1, Stdout, "[a]:", "Name? "), permit(&s), t0);
    w.set_status(Some("waiting 3s".into()));
    assert!(!err.text().contains("3s"), "drawn into an open line");
    w.accept(cont(1, Stdout, "[a]:", "bob\n", false), None, t0);
    w.set_status(Some("waiting 4s".into()));
    w.own_text(Stderr, b"rdrun: line\n");
    w.set_status(None);
    assert_eq!(
        e(&err.text()),
        "<E>⠁ waiting 1s<E>⠂ waiting 2s<E><E>⠄ waiting 4s<E>rdrun: line\n"
    );
    // Not the terminal's console (an in-memory one): never drawn.
    let (out2, err2) = (Rec::default(), Rec::default());
    let (mut w2, _) = writer(true, &out2, &err2);
    w2.set_status(Some("waiting".into()));
    assert_eq!(err2.text(), "");
}
