//! What a Python stack says about where a process waits: one `py-spy dump` frame parsed
//! ([`Frame`]), its file classed as the user's own code, the standard library or a third-party
//! package ([`Origin`]), and a main thread's stack classed as a collective wait (a healthy
//! waiter), a DataLoader wait, a wait in the user's own code, plain user code or another
//! library call ([`StackKind`]); plus the short "library call ← user frame" text the stderr
//! block shows. Pure: the suspect rules (`suspect.rs`) and the block read it.

/// One frame of a `py-spy dump` text: `name (file:line)`, innermost first in a stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Function name as py-spy prints it (0.4 qualifies methods: `Event.wait`).
    pub name: &'a str,
    pub file: &'a str,
    pub line: Option<u32>,
}

impl<'a> Frame<'a> {
    /// Parses `name (file:line)` or `name (file)`; None for anything else.
    pub fn parse(text: &'a str) -> Option<Frame<'a>> {
        let text = text.trim();
        let body = text.strip_suffix(')')?;
        let open = body.rfind(" (")?;
        let (name, loc) = (&body[..open], &body[open + 2..]);
        let (file, line) = match loc.rsplit_once(':') {
            Some((f, l)) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => {
                (f, l.parse().ok())
            }
            _ => (loc, None),
        };
        (!name.is_empty() && !file.is_empty()).then_some(Frame { name, file, line })
    }

    pub fn origin(&self) -> Origin {
        origin_of(self.file)
    }

    /// The last part of the (possibly qualified) name: `wait` of `Event.wait`.
    pub fn base_name(&self) -> &'a str {
        self.name.rsplit('.').next().unwrap_or(self.name)
    }

    /// The file relative to its package root (`torch/autograd/graph.py`, `threading.py`) for
    /// library frames, the file name alone for the user's own.
    pub fn short_file(&self) -> &'a str {
        match self.origin() {
            Origin::User => self.file.rsplit('/').next().unwrap_or(self.file),
            _ => package_path(self.file),
        }
    }

    /// `name (short_file:line)`.
    pub fn short(&self) -> String {
        match self.line {
            Some(l) => format!("{} ({}:{l})", self.name, self.short_file()),
            None => format!("{} ({})", self.name, self.short_file()),
        }
    }
}

/// Where a frame's code comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Not under site-packages/dist-packages nor the standard library: the user's own code.
    User,
    Stdlib,
    /// A package under site-packages or dist-packages (torch, deepspeed, ...).
    ThirdParty,
}

/// Standard-library top-level modules a shortened (relative) file name can start with: py-spy
/// prints such names without `--full-filenames`, and rdrun asks for full ones, so this list
/// only has to cover the waits and plumbing that show up in stacks.
const STDLIB_SHORT: &[&str] = &[
    "threading.py",
    "queue.py",
    "selectors.py",
    "socket.py",
    "subprocess.py",
    "contextlib.py",
    "functools.py",
    "runpy.py",
    "ssl.py",
    "time.py",
    "multiprocessing",
    "concurrent",
    "asyncio",
    "importlib",
    "http",
    "urllib",
];

/// Third-party packages a shortened file name can start with (see [`STDLIB_SHORT`]).
const THIRD_PARTY_SHORT: &[&str] = &["torch", "deepspeed", "accelerate", "lightning"];

/// The stdlib directory part of a full path: `/lib/python3.11/` (or `lib64`, a free-threaded
/// `python3.13t`), as the index just after it.
fn stdlib_dir_end(file: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = file[from..].find("/python") {
        let at = from + i;
        let before = &file[..at];
        let rest = &file[at + "/python".len()..];
        let ver = rest.find('/').map(|j| &rest[..j]).filter(|v| {
            let v = v.strip_suffix('t').unwrap_or(v);
            !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        });
        if let (true, Some(v)) = (before.ends_with("/lib") || before.ends_with("/lib64"), ver) {
            return Some(at + "/python".len() + v.len() + 1);
        }
        from = at + 1;
    }
    None
}

/// Where the code of `file` comes from (a full path as `py-spy dump --full-filenames` prints
/// it, or a shortened one).
pub fn origin_of(file: &str) -> Origin {
    if file.contains("/site-packages/") || file.contains("/dist-packages/") {
        return Origin::ThirdParty;
    }
    if file.starts_with("<frozen ") {
        return Origin::Stdlib;
    }
    if file.starts_with('/') {
        return if stdlib_dir_end(file).is_some() {
            Origin::Stdlib
        } else {
            Origin::User
        };
    }
    let first = file.split('/').next().unwrap_or(file);
    if THIRD_PARTY_SHORT.contains(&first) {
        Origin::ThirdParty
    } else if STDLIB_SHORT.contains(&first) {
        Origin::Stdlib
    } else {
        Origin::User
    }
}

/// A library file relative to its package root: after `site-packages/`, `dist-packages/` or
/// the stdlib directory; the text as given otherwise.
fn package_path(file: &str) -> &str {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return &file[i + marker.len()..];
        }
    }
    match stdlib_dir_end(file) {
        Some(i) => &file[i..],
        None => file,
    }
}

/// Functions of third-party (never stdlib: `Event.wait` is not one) frames that wait for the
/// other ranks: collectives, DDP's parameter and buffer syncs, autograd's engine (where DDP's
/// reducer waits for its all_reduce at the end of backward), a device synchronize.
const COLLECTIVE_NAMES: &[&str] = &[
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "wait",
    "synchronize",
    "_sync_params",
    "_sync_buffers",
    "_sync_module_states",
    "_engine_run_backward",
    "run_backward",
];

/// Third-party code whose every frame waits on the other ranks (torch.distributed, DDP and
/// FSDP, the autograd engine, DeepSpeed's comm layer).
const COLLECTIVE_PACKAGES: &[&str] = &[
    "torch/distributed/",
    "torch/nn/parallel/",
    "torch/autograd/",
    "deepspeed/comm/",
];

/// Whether one frame waits on the other ranks: a third-party frame in a collective package or
/// named like a collective.
pub fn is_collective_frame(f: &Frame) -> bool {
    f.origin() == Origin::ThirdParty
        && (COLLECTIVE_PACKAGES
            .iter()
            .any(|p| package_path(f.file).starts_with(p))
            || COLLECTIVE_NAMES.contains(&f.base_name()))
}

/// Loops a worker process idles in while it waits for work: such a process with the user's
/// code only *below* the loop (frames inherited from the parent it was forked from) is idle.
fn is_idle_loop(f: &Frame) -> bool {
    let p = package_path(f.file);
    matches!(
        (f.base_name(), p),
        ("_worker_loop", "torch/utils/data/_utils/worker.py")
            | ("worker", "multiprocessing/pool.py")
            | ("_process_worker", "concurrent/futures/process.py")
    )
}

/// What a main thread is doing, from its frames (innermost first). Only the *innermost library
/// call* counts, the frames inside the innermost user frame: a rank whose own code waits on a
/// `threading.Event` from inside a DDP step is waiting on its own code, not on DDP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackKind {
    /// Inside a collective, DDP or autograd's engine: waiting for the other ranks (healthy).
    Collective,
    /// Inside a DataLoader's `__next__`: waiting on its worker processes.
    DataLoader,
    /// In a standard-library wait (`Event.wait`, `Queue.get`, a lock) the user's code called:
    /// `call` is the call the user made, `user` the frame that made it (both short).
    OwnWait { call: String, user: String },
    /// The innermost frame is the user's code (running, or in a C call such as `time.sleep`).
    OwnCode,
    /// Inside some other library call.
    Library,
    /// No frames.
    Unknown,
}

/// Classes a main thread's stack ([`StackKind`]).
pub fn classify(frames: &[String]) -> StackKind {
    let parsed: Vec<Option<Frame>> = frames.iter().map(|f| Frame::parse(f)).collect();
    let is_user = |f: &Option<Frame>| f.as_ref().is_some_and(|f| f.origin() == Origin::User);
    if parsed.is_empty() {
        return StackKind::Unknown;
    }
    let user = parsed.iter().position(is_user);
    let inner: Vec<&Frame> = parsed[..user.unwrap_or(parsed.len())]
        .iter()
        .flatten()
        .collect();
    if inner.is_empty() {
        return StackKind::OwnCode;
    }
    if inner.iter().any(|f| is_collective_frame(f)) {
        return StackKind::Collective;
    }
    if inner
        .iter()
        .any(|f| package_path(f.file).starts_with("torch/utils/data/"))
    {
        return StackKind::DataLoader;
    }
    if let (true, Some(u)) = (
        inner.iter().all(|f| f.origin() == Origin::Stdlib),
        user.and_then(|u| parsed[u].as_ref()),
    ) {
        let call = inner.last().map_or(String::new(), |f| f.name.to_string());
        return StackKind::OwnWait {
            call,
            user: u.short(),
        };
    }
    StackKind::Library
}

/// Whether a child process of a rank is stuck: the user's code is on its main thread and not
/// only below an idle worker loop (a DataLoader worker forked from the training script carries
/// the script's frames under `_worker_loop`; waiting there for an index is idle). A process
/// with no user frame at all (a resource tracker, a compile worker) is library plumbing.
pub fn child_is_stuck(frames: &[String]) -> bool {
    let parsed: Vec<Option<Frame>> = frames.iter().map(|f| Frame::parse(f)).collect();
    let user = parsed
        .iter()
        .position(|f| f.as_ref().is_some_and(|f| f.origin() == Origin::User));
    let idle = parsed
        .iter()
        .position(|f| f.as_ref().is_some_and(is_idle_loop));
    match (user, idle) {
        (None, _) => false,
        (Some(u), Some(l)) => u < l,
        (Some(_), None) => true,
    }
}

/// The innermost frame of the user's own code, short (`step (train.py:36)`).
pub fn innermost_user_frame(frames: &[String]) -> Option<String> {
    frames
        .iter()
        .filter_map(|f| Frame::parse(f))
        .find(|f| f.origin() == Origin::User)
        .map(|f| f.short())
}

/// What the stderr block shows of a stack: the innermost frame, and when that is a library's,
/// the innermost frame of the user's own code after it (`all_reduce ← step (train.py:5)`).
pub fn describe(frames: &[String]) -> Option<String> {
    let top = frames.first()?;
    let Some(f) = Frame::parse(top) else {
        return Some(top.clone());
    };
    if f.origin() == Origin::User {
        return Some(f.short());
    }
    Some(match innermost_user_frame(frames) {
        Some(u) => format!("{} ← {u}", f.name),
        None => f.short(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VENV: &str = "/root/.cache/rdrun/torch-venv/lib/python3.11/site-packages";
    const STDLIB: &str = "/root/.pyenv/versions/3.11.7/lib/python3.11";
    const USER: &str = "/work/job/train.py";

    fn frames(spec: &[(&str, &str, u32)]) -> Vec<String> {
        spec.iter()
            .map(|(n, f, l)| {
                let f = f
                    .replace("$V", VENV)
                    .replace("$S", STDLIB)
                    .replace("$U", USER);
                format!("{n} ({f}:{l})")
            })
            .collect()
    }

    #[test]
    fn parse_and_origin() {
        let f = Frame::parse("Event.wait (/usr/lib/python3.11/threading.py:629)").unwrap();
        assert_eq!(
            (f.name, f.file, f.line),
            ("Event.wait", "/usr/lib/python3.11/threading.py", Some(629))
        );
        assert_eq!(f.base_name(), "wait");
        assert_eq!(f.origin(), Origin::Stdlib);
        assert_eq!(f.short(), "Event.wait (threading.py:629)");
        let g = Frame::parse("<module> (/work/job/train.py)").unwrap();
        assert_eq!((g.line, g.origin()), (None, Origin::User));
        assert!(Frame::parse("Locals:").is_none());
        assert!(Frame::parse("(x.py:1)").is_none());

        for (file, o) in [
            (
                format!("{VENV}/torch/autograd/graph.py"),
                Origin::ThirdParty,
            ),
            (
                "/usr/lib/python3/dist-packages/numpy/core.py".into(),
                Origin::ThirdParty,
            ),
            (
                format!("{STDLIB}/multiprocessing/queues.py"),
                Origin::Stdlib,
            ),
            ("/usr/lib64/python3.13t/threading.py".into(), Origin::Stdlib),
            ("<frozen importlib._bootstrap>".into(), Origin::Stdlib),
            (USER.into(), Origin::User),
            ("/home/u/python/train.py".into(), Origin::User),
            ("/opt/lib/pythonista/x.py".into(), Origin::User),
            ("<string>".into(), Origin::User),
            (
                "torch/distributed/distributed_c10d.py".into(),
                Origin::ThirdParty,
            ),
            ("threading.py".into(), Origin::Stdlib),
            ("train.py".into(), Origin::User),
        ] {
            assert_eq!(origin_of(&file), o, "{file}");
        }
    }

    #[test]
    fn describe_shows_the_library_call_and_the_users_frame() {
        let ar = frames(&[
            (
                "all_reduce",
                "$V/torch/distributed/distributed_c10d.py",
                4181,
            ),
            ("wrapper", "$V/torch/distributed/c10d_logger.py", 81),
            ("wait_for_the_others", "$U", 5),
            ("<module>", "$U", 9),
        ]);
        assert_eq!(
            describe(&ar).unwrap(),
            "all_reduce ← wait_for_the_others (train.py:5)"
        );
        let own = frames(&[("desert", "$U", 28), ("<module>", "$U", 40)]);
        assert_eq!(describe(&own).unwrap(), "desert (train.py:28)");
        let lib_only = frames(&[("_worker_loop", "$V/torch/utils/data/_utils/worker.py", 335)]);
        assert_eq!(
            describe(&lib_only).unwrap(),
            "_worker_loop (torch/utils/data/_utils/worker.py:335)"
        );
        assert_eq!(describe(&[]), None);
        assert_eq!(describe(&["odd".to_string()]).unwrap(), "odd");
    }

    /// Real stacks (py-spy 0.4.3 --full-filenames) of a 2-rank gloo DDP job whose rank 1 waits
    /// on a threading.Event in its step: rank 0 waits in DDP's backward.
    #[test]
    fn ddp_backward_is_a_collective_and_an_event_wait_is_the_users() {
        let rank0 = frames(&[
            ("_engine_run_backward", "$V/torch/autograd/graph.py", 1113),
            ("backward", "$V/torch/autograd/__init__.py", 395),
            ("Tensor.backward", "$V/torch/_tensor.py", 623),
            ("step", "$U", 36),
            ("<module>", "$U", 41),
        ]);
        let rank1 = frames(&[
            ("Condition.wait", "$S/threading.py", 327),
            ("Event.wait", "$S/threading.py", 629),
            ("wait_for_the_signal", "$U", 28),
            ("step", "$U", 33),
            ("<module>", "$U", 41),
        ]);
        assert_eq!(classify(&rank0), StackKind::Collective);
        assert_eq!(
            classify(&rank1),
            StackKind::OwnWait {
                call: "Event.wait".into(),
                user: "wait_for_the_signal (train.py:28)".into()
            }
        );
        // A user's wait inside a custom autograd Function's backward is still the user's.
        let mut nested = rank1[..3].to_vec();
        nested.extend(rank0.clone());
        assert!(matches!(classify(&nested), StackKind::OwnWait { .. }));
        // DDP's forward-time syncs.
        let sync = frames(&[
            ("_sync_buffers", "$V/torch/nn/parallel/distributed.py", 2001),
            ("forward", "$V/torch/nn/parallel/distributed.py", 1650),
            ("step", "$U", 30),
        ]);
        assert_eq!(classify(&sync), StackKind::Collective);
        assert_eq!(
            classify(&frames(&[("desert", "$U", 28)])),
            StackKind::OwnCode
        );
        assert_eq!(classify(&[]), StackKind::Unknown);
    }

    /// Real stacks of a rank whose DataLoader worker is stuck: the rank's main thread waits in
    /// the DataLoader; the stuck worker runs the dataset's code; the idle worker waits in
    /// `_worker_loop` above the script's frames it inherited from the fork.
    #[test]
    fn dataloader_wait_and_stuck_or_idle_workers() {
        let main = frames(&[
            ("_PollLikeSelector.select", "$S/selectors.py", 415),
            ("wait", "$S/multiprocessing/connection.py", 947),
            ("Connection._poll", "$S/multiprocessing/connection.py", 440),
            (
                "_ConnectionBase.poll",
                "$S/multiprocessing/connection.py",
                257,
            ),
            ("Queue.get", "$S/multiprocessing/queues.py", 113),
            (
                "_MultiProcessingDataLoaderIter._try_get_data",
                "$V/torch/utils/data/dataloader.py",
                1293,
            ),
            (
                "_MultiProcessingDataLoaderIter._next_data",
                "$V/torch/utils/data/dataloader.py",
                1507,
            ),
            (
                "_BaseDataLoaderIter.__next__",
                "$V/torch/utils/data/dataloader.py",
                725,
            ),
            ("<module>", "$U", 46),
        ]);
        assert_eq!(classify(&main), StackKind::DataLoader);
        let fork_tail = [
            ("BaseProcess.run", "$S/multiprocessing/process.py", 108),
            (
                "BaseProcess._bootstrap",
                "$S/multiprocessing/process.py",
                314,
            ),
            ("Popen._launch", "$S/multiprocessing/popen_fork.py", 71),
            (
                "_MultiProcessingDataLoaderIter.__init__",
                "$V/torch/utils/data/dataloader.py",
                1178,
            ),
            (
                "DataLoader.__iter__",
                "$V/torch/utils/data/dataloader.py",
                505,
            ),
            ("<module>", "$U", 46),
        ];
        let mut idle = vec![
            ("_PollLikeSelector.select", "$S/selectors.py", 415),
            ("Queue.get", "$S/multiprocessing/queues.py", 113),
            ("_worker_loop", "$V/torch/utils/data/_utils/worker.py", 335),
        ];
        idle.extend(fork_tail);
        let mut stuck = vec![
            ("stuck_forever", "$U", 29),
            ("Samples.__getitem__", "$U", 38),
            (
                "_MapDatasetFetcher.fetch",
                "$V/torch/utils/data/_utils/fetch.py",
                54,
            ),
            ("_worker_loop", "$V/torch/utils/data/_utils/worker.py", 375),
        ];
        stuck.extend(fork_tail);
        assert!(!child_is_stuck(&frames(&idle)));
        assert!(child_is_stuck(&frames(&stuck)));
        // Blocked in a library call from the dataset's code: stuck too.
        let mut reading = vec![("read", "$V/PIL/Image.py", 800)];
        reading.extend(stuck.clone());
        assert!(child_is_stuck(&frames(&reading)));
        // Library-only processes are plumbing, never stuck.
        let tracker = frames(&[("main", "$S/multiprocessing/resource_tracker.py", 201)]);
        assert!(!child_is_stuck(&tracker));
        assert_eq!(
            describe(&frames(&stuck)).unwrap(),
            "stuck_forever (train.py:29)"
        );
    }
}
