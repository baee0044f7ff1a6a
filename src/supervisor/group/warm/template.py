# rdrun's warm-start template interpreter (docs/warm-start.md). Started once per node as
# `python -u -c <BOOTSTRAP> FD PAD` with the workers' interpreter and environment (minus
# per-rank variables); the bootstrap reads this program as the socket's first message, the
# second is the workers' sys.path[0] and the modules to preload (NUL-separated).
# It imports the preload list, then forks one worker per request received on the SOCK_SEQPACKET
# unix socket FD. It never runs user code itself and never initialises CUDA. PAD only sizes the
# command-line area, which each worker overwrites with its own command line.
# In a worker it makes what a fresh interpreter would have made for itself (docs/warm-start.md
# "Parity"): random generators and secrets drawn again, threading's main thread, a fresh
# `__main__`, the user's code run as the outermost Python frame (topframe.py, sent ahead of
# this file as one program).
#
# Request: NUL-separated fields: b"fork", rdrun's pid, cwd, CPU list ("" = unchanged), the count
# of argv words, argv (the interpreter's arguments: -u script.. / -u -m mod.. / -u -c code..),
# then the environment as KEY=VALUE; ancillary SCM_RIGHTS: stdout, stderr[, stdin].
# Replies: b"pid N" | b"cold REASON" | b"error REASON". First message: b"ready PID WHAT" (WHAT:
# the interpreter's version and what it imported, for rdrun's line) or b"failed REASON".
import os
import socket
import struct
import sys

_SOCK_FD = int(sys.argv[1])
_CONFIG = os.read(_SOCK_FD, 1 << 20).split(b"\0")
_PATH0 = os.fsdecode(_CONFIG[0])
# The rest: modules to preload (--preload), and options as "=NAME=VALUE" (a module name never
# starts with "="): "=bare" (--warm-start auto: torch is imported only once the workers are
# known to import it), "=learn=DIR" (the workers report what they import there: learn.py),
# "=memory=FILE" (where the learned list of this job is remembered across runs), "=script=PATH"
# (the script, whose edits invalidate it).
_REQUIRED = [m.decode() for m in _CONFIG[1:] if m and not m.startswith(b"=")]
_OPTS = dict(
    os.fsdecode(m[1:]).partition("=")[::2] for m in _CONFIG[1:] if m.startswith(b"=")
)
_BARE = "bare" in _OPTS
_RDRUN = os.getppid()

# The workers' sys.path[0] (script directory, cwd for -m, '' for -c), so that the preload
# imports resolve as they would in a cold worker.
if not sys.flags.safe_path and sys.path and sys.path[0] == "":
    sys.path[0] = _PATH0

_sock = socket.socket(fileno=_SOCK_FD)


def _send(msg):
    _sock.send(msg if isinstance(msg, bytes) else msg.encode("utf-8", "replace"))


def _note(level, text):
    """A line for rdrun's log ("info" or "warn"), read by rdrun with its next answer. Never
    blocks: a note that does not fit in the socket's buffer is dropped."""
    try:
        _sock.send(("note %s %s" % (level, text)).encode("utf-8", "replace"), socket.MSG_DONTWAIT)
    except OSError:
        pass


def _preload():
    import importlib

    # torch first when importable (a missing torch is no error: nothing to preload then);
    # under --warm-start auto only once the workers are known to import it (learn.py).
    if not _BARE:
        try:
            importlib.import_module("torch")
        except ModuleNotFoundError as e:
            if e.name != "torch":
                return "torch: %s: %s" % (type(e).__name__, e)
        except BaseException as e:  # noqa: BLE001 - any failure means: no warm start
            return "torch: %s: %s" % (type(e).__name__, e)
    for name in _REQUIRED:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001
            return "%s: %s: %s" % (name, type(e).__name__, e)
    if _LEARN_DIR is not None:
        _preload_remembered()
    # What the imports left must allow forking (docs/warm-start.md "Fork safety"; CUDA: a
    # torch built for CUDA must not initialise it at import, checked after every batch).
    why = _fork_breach()
    if why is not None and not why.startswith("thread"):
        return "the imports left the template unsafe to fork: " + why
    return None



# ---- what the imports leave that a fresh process would make its own ----------------------
# random.Random instances a module created and seeded from OS entropy while the template
# imported (sympy's `rng` and `_assumptions_rng` with the DDP preload list): a fresh process
# draws its own, so each worker seeds them again (`_fresh_process_state`). One seeded again
# with a value (a deliberate, fixed seed) is dropped. id -> weak reference.
_ENTROPY_SEEDED = {}
# Variables that Python code looked up (os.environ[...], .get, `in`, os.getenv) while the
# template imported: every worker has the template's value in what those imports computed.
# A worker that changes one is told once (`_watch_env`). Whole-environment copies and
# iterations are not lookups of a name and are left out.
_READ_AT_IMPORT = set()
# Variables read by C libraries when `import torch` loads them (OpenMP, BLAS, MKL, numpy's CPU
# dispatch; measured with scripts/import-env-vars.py, docs/warm-start.md): they are fixed for
# the life of the process, so a worker that changes one is told as well.
_LOAD_TIME_PREFIXES = (
    "OMP_", "GOMP_", "KMP_", "MKL_", "MKLDNN_", "OPENBLAS_", "GOTO_", "BLIS_", "GFORTRAN_", "NPY_",
)


def _recording(fn):
    """fn(), with the random.Random instances seeded from entropy and the names os.environ was
    asked for recorded (both patches are undone before fn's result is returned)."""
    import random
    import weakref

    rnd_seed = random.Random.seed
    env_cls = type(os.environ)
    env_get, env_iter = env_cls.__getitem__, env_cls.__iter__
    enumerating = set()
    helpers = (os.__dict__, sys.modules["_collections_abc"].__dict__)

    def site():
        # The code outside os and collections.abc (Mapping.get, ItemsView, ...) that asked, and
        # where: one call, e.g. dict(os.environ), is one site for the iteration and each lookup
        # it makes.
        f = sys._getframe(2)
        while f is not None and (f.f_globals is helpers[0] or f.f_globals is helpers[1]):
            f = f.f_back
        return None if f is None else (f.f_code, f.f_lasti)

    def seed(self, *args, **kwargs):
        rnd_seed(self, *args, **kwargs)
        a = args[0] if args else kwargs.get("a")
        if a is None:
            try:
                _ENTROPY_SEEDED[id(self)] = weakref.ref(self)
            except TypeError:
                pass
        else:
            _ENTROPY_SEEDED.pop(id(self), None)

    def getitem(self, key):
        if self is os.environ and site() not in enumerating:
            _READ_AT_IMPORT.add(key)
        return env_get(self, key)

    def iterate(self):
        if self is os.environ:
            enumerating.add(site())
        return env_iter(self)

    random.Random.seed = seed
    env_cls.__getitem__, env_cls.__iter__ = getitem, iterate
    try:
        return fn()
    finally:
        random.Random.seed = rnd_seed
        env_cls.__getitem__, env_cls.__iter__ = env_get, env_iter


# ---- fork safety -------------------------------------------------------------------------
# A thread other than the main one is fork-safe only when it is OpenBLAS's server thread:
# OpenBLAS stops its servers around fork() with pthread_atfork. Threads are identified by the
# library that owns them: the code addresses on the thread's stack (read from /proc/self/mem
# at the stack pointer that /proc/self/task/TID/syscall reports), mapped to the executable
# mappings of /proc/self/maps. Allowed: every non-libc code address lies in an OpenBLAS
# library (libopenblas*, libscipy_openblas*), and there is at least one.
_LIBC = ("libc.so", "libc-", "ld-linux", "libpthread", "[vdso]", "[vsyscall]")
_STACK_SCAN = 16384


def _code_maps():
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()
            if len(p) >= 6 and "x" in p[1]:
                a, b = (int(x, 16) for x in p[0].split("-"))
                out.append((a, b, p[5]))
    return out


def _thread_libs(tid, maps):
    """Libraries (basenames) whose code addresses are on thread `tid`'s stack; None when the
    thread is running (no stack pointer to read) or its stack cannot be read."""
    try:
        with open("/proc/self/task/%d/syscall" % tid) as f:
            fields = f.read().split()
    except OSError:
        return set()  # gone
    if not fields or fields[0] == "running" or len(fields) < 3:
        return None
    sp, pc = int(fields[-2], 16), int(fields[-1], 16)
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(sp)
            data = mem.read(_STACK_SCAN)
    except OSError:
        return None
    words = [pc] + [w for (w,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8])]
    libs = set()
    for w in words:
        for a, b, name in maps:
            if a <= w < b:
                libs.add(os.path.basename(name))
                break
    return libs


def _is_openblas(lib):
    return "openblas" in lib.lower()


# Threads already identified as fork-safe, by (tid, start time): a thread stays the thread it
# was identified as for its life, and a reused tid has another start time. The list of threads
# is still read before every fork; only the stack scan of a known thread is skipped (it costs
# ~6 ms per fork with torch's maps, on the restart's critical path).
_known_safe = set()


def _start_time(tid):
    try:
        with open("/proc/self/task/%d/stat" % tid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime); the fields after the command name's closing parenthesis.
    return stat[stat.rfind(b")") + 2 :].split()[19]


def _unsafe_threads():
    """None when every thread besides the main one is known fork-safe, else why not."""
    me = os.getpid()
    tids = [int(t) for t in os.listdir("/proc/self/task") if int(t) != me]
    if not tids:
        return None
    ids = {tid: _start_time(tid) for tid in tids}
    tids = [tid for tid in tids if ids[tid] is None or (tid, ids[tid]) not in _known_safe]
    if not tids:
        return None
    maps = _code_maps()
    for tid in tids:
        libs = None
        for _ in range(50):  # a running thread has no readable stack pointer: retry a while
            libs = _thread_libs(tid, maps)
            if libs is not None:
                break
            import time

            time.sleep(0.001)
        if libs is not None and not libs:
            continue  # exited meanwhile
        try:
            with open("/proc/self/task/%d/comm" % tid) as f:
                comm = f.read().strip()
        except OSError:
            continue
        own = sorted(l for l in (libs or ()) if not l.startswith(_LIBC))
        if libs is None:
            return "thread %d (%s) is always running; its owner cannot be identified" % (tid, comm)
        if not own or not all(_is_openblas(l) for l in own):
            return "thread %d (%s, from %s) is not known to be fork-safe" % (
                tid,
                comm,
                ", ".join(own) or "an unknown library",
            )
        if ids[tid] is not None:
            _known_safe.add((tid, ids[tid]))
    return None


# ---- one worker ---------------------------------------------------------------------------
def _parse(argv):
    """(kind, target, sys.argv, sys.path[0]) for `python ARGV`, or a str: why not."""
    if not argv or argv[0] != "-u":
        return "the worker's interpreter arguments are not rdrun's (-u ...)"
    rest = argv[1:]
    if not rest:
        return "no script"
    if rest[0] == "-m" and len(rest) >= 2:
        return ("module", rest[1], [rest[1]] + rest[2:], os.getcwd())
    if rest[0] == "-c" and len(rest) >= 2:
        return ("code", rest[1], ["-c"] + rest[2:], "")
    if rest[0].startswith("-"):
        return "interpreter option %s" % rest[0]
    script = rest[0]
    path0 = os.path.dirname(os.path.realpath(script))
    if os.path.isdir(script) or not os.path.isfile(script):
        return ("dir", script, rest, script)
    return ("script", script, rest, path0)


def _reset_signals():
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            if sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_IGN)
            else:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass


def _become_worker(req, fds):
    """In the grandchild: everything a cold `python -u ...` would have, then the job to run."""
    rdrun, cwd, cpus, argv, env = req
    # (Already its own session: `_serve_burst` made it one before it answered rdrun.)
    # Parent-death signal once rdrun (the subreaper) is the parent: the intermediate process
    # exits right after the fork, so this wait is short; a parent-death signal set earlier
    # would fire when the intermediate exits.
    import time

    deadline = time.monotonic() + 10
    while os.getppid() != rdrun:
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0002)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != rdrun:
        os.kill(os.getpid(), 9)
    if cpus:
        os.sched_setaffinity(0, cpus)
    out, err = fds[0], fds[1]
    inp = fds[2] if len(fds) > 2 else None
    os.dup2(out, 1)
    os.dup2(err, 2)
    if inp is not None:
        os.dup2(inp, 0)
    else:
        os.close(0)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    _sock.close()
    _reset_signals()
    os.environ.clear()
    for k, v in env:
        os.environ[k] = v
    os.chdir(cwd)
    return argv


def _argv0():
    with open("/proc/self/cmdline", "rb") as f:
        return f.read().split(b"\0")[0]


_ARGV0 = _argv0()


def _set_cmdline(argv):
    """/proc/self/cmdline (what ps, py-spy and rdrun's messages show) as a cold worker's:
    the interpreter's path, then `argv`, written over the template's command-line area (rdrun
    sized it for the first worker; a longer one is cut, a shorter one padded with NULs)."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # proc(5): fields 48 and 49
    except (OSError, ValueError, IndexError):
        return
    n = end - start
    if n <= 0:
        return
    data = b"\0".join([_ARGV0] + [os.fsencode(a) for a in argv]) + b"\0"
    data = data[: n - 1] + b"\0" if len(data) > n else data + b"\0" * (n - len(data))
    ctypes.memmove(start, data, n)


def _fresh_process_state():
    """In a worker: every per-process random state and secret a fresh interpreter draws for
    itself (at start-up or when the module is imported), drawn again, and the process's own
    identity where a module keeps it (docs/warm-start.md "Parity")."""
    import random

    random.seed()  # CPython reseeds at fork too; once more costs nothing
    for ref in _ENTROPY_SEEDED.values():
        r = ref()
        if r is not None:
            try:
                r.seed()
            except Exception:  # noqa: BLE001
                pass
    mtrand = sys.modules.get("numpy.random.mtrand")
    if mtrand is not None:
        try:
            # The legacy global state (np.random.rand, np.random.shuffle, ...) as numpy's import
            # makes it, from a new RandomState: it is not reseeded at fork.
            mtrand._rand.set_state(mtrand.RandomState().get_state())
        except Exception:  # noqa: BLE001
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            # As a fresh process seeds it (64 bits from /dev/urandom); the generator's own
            # method: torch.seed() would also queue a seed for CUDA's generators, which are
            # created (and seeded) lazily in the worker, as in a cold one.
            torch.default_generator.seed()
        except Exception:  # noqa: BLE001
            pass
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        try:
            # os.urandom(32) when multiprocessing is imported: it authenticates connections to
            # this process's managers and listeners.
            process.current_process().authkey = os.urandom(32)
        except Exception:  # noqa: BLE001
            pass
    threading = sys.modules.get("threading")
    if threading is not None:
        main = threading.main_thread()
        if hasattr(main, "_set_native_id"):
            main._set_native_id()  # threading's at-fork handler renews ident, not native_id
    logging = sys.modules.get("logging")
    if logging is not None and hasattr(logging, "_startTime"):
        import time

        # LogRecord.relativeCreated counts from here (the import of logging, in a cold worker).
        start = logging._startTime
        logging._startTime = time.time_ns() if isinstance(start, int) else time.time()


# How long the intermediate of a burst waits for the burst's next request before it ends the
# burst itself (rdrun stopped spawning early, e.g. a launch error): the workers it forked wait
# for it to exit before they run, so this bounds their wait, not correctness.
_BURST_IDLE = 2.0


def _read_request():
    """The next request: (msg, fds); exits when rdrun is gone or done."""
    try:
        msg, fds, _flags, _addr = socket.recv_fds(_sock, 1 << 22, 3)
    except (ConnectionError, OSError):
        os._exit(0)
    if not msg:
        os._exit(0)
    return msg, fds


def _parse_request(msg):
    parts = msg.split(b"\0")
    if parts[0] not in (b"fork", b"fork+"):
        raise ValueError("unknown request")
    more = parts[0] == b"fork+"
    rdrun = int(parts[1])
    cwd = os.fsdecode(parts[2])
    cpus = [int(c) for c in parts[3].split(b",") if c]
    n = int(parts[4])
    argv = [os.fsdecode(a) for a in parts[5 : 5 + n]]
    env = []
    for kv in parts[5 + n :]:
        k, _, v = kv.partition(b"=")
        if k:
            env.append((os.fsdecode(k), os.fsdecode(v)))
    return more, (rdrun, cwd, cpus, argv, env)


def _close(fds):
    for fd in fds:
        os.close(fd)


def _serve():
    """Serves requests until rdrun closes the socket; in a forked worker returns its argv.

    A worker's parent must be rdrun (a subreaper), so it is forked by an intermediate process
    that then exits. One intermediate serves a whole burst: a request marked `fork+` says that
    rdrun will ask for another worker right after (the rest of a group's local ranks), and the
    intermediate reads that request itself, forks that worker too and exits after the burst's
    last one. A group of N workers then costs N + 1 forks and one exit of a copy of this
    interpreter, not 2N forks and N exits, each with the scheduling hand-offs between rdrun,
    this process and an intermediate. The template meanwhile waits for the intermediate (it
    never reads the socket while one serves). Every answer goes to rdrun on the socket, from
    whichever process forked, or a worker's pid from the worker itself once it leads its own
    process group: rdrun has one request in flight at a time, so answers cannot cross. The
    workers wait until rdrun is their parent (the intermediate gone) before anything
    runs (`_become_worker`)."""
    while True:
        # Between requests the template learns what the workers import (learn.py); a request
        # that arrives meanwhile waits for one module's import at most.
        while _learn_step(_sock):
            pass
        msg, fds = _read_request()
        if msg == b"end":
            continue  # a burst that ended on its own already (its idle bound)
        try:
            more, req = _parse_request(msg)
        except (ValueError, IndexError) as e:
            _close(fds)
            _send("error bad request: %s" % e)
            continue
        reason = _unsafe_threads() or _fork_refusal()
        if reason is not None:
            _close(fds)
            _send("cold " + reason)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            first = os.fork()
        except OSError as e:
            _close(fds)
            _send("error fork: %s" % e)
            continue
        if first == 0:
            # The intermediate: never back into this loop, whatever happens.
            try:
                return _serve_burst(more, req, fds)
            except BaseException:  # noqa: BLE001
                os._exit(1)
        _close(fds)
        try:
            os.waitpid(first, 0)
        except ChildProcessError:
            pass


def _serve_burst(more, req, fds):
    """In a burst's intermediate (one thread: fork copies only the caller's): forks the worker of
    each request of the burst, answers rdrun, exits after the last. Returns only in a worker."""
    import select

    while True:
        try:
            pid = os.fork()
        except OSError as e:
            pid = None
            _send("error fork: %s" % e)
        if pid == 0:
            # The worker answers rdrun itself, once it leads its own session and process
            # group: rdrun stops a worker by signalling its group, and a stop that rdrun
            # begins right after this spawn (a shutdown signal that arrived while the
            # template imported) would find no group yet and miss a worker that had not
            # reached setsid(), which then ran until the grace's SIGKILL. A cold spawn
            # returns after exec, its setsid() done, too.
            try:
                os.setsid()
            except OSError as e:
                _send("error setsid: %s" % e)
                os._exit(127)
            _send(b"pid %d" % os.getpid())
            return _become_worker(req, fds)
        _close(fds)
        # (A poll, not a socket timeout: that would make the file description, shared with
        # the template, non-blocking for the template too.)
        if not more or not select.select([_sock], [], [], _BURST_IDLE)[0]:
            os._exit(0)
        msg, fds = _read_request()
        if msg == b"end":
            os._exit(0)  # rdrun starts the burst's next worker cold
        try:
            more, req = _parse_request(msg)
        except (ValueError, IndexError) as e:
            _close(fds)
            _send("error bad request: %s" % e)
            os._exit(0)
        # Checked before every fork, here too (this process has only the thread that forked
        # it, unless an at-fork handler started one).
        reason = _unsafe_threads() or _fork_refusal()
        if reason is not None:
            _close(fds)
            _send("cold " + reason)
            os._exit(0)  # the burst ends: rdrun does not keep it open after a cold answer


# What the imports print (warnings, banners) a cold worker prints itself when it imports: it is
# captured here and written to each worker's own stdout and stderr before its code runs.
_CAPTURE_MAX = 1 << 20


def _captured(fn):
    saved, caps = [], []
    for fd in (1, 2):
        m = os.memfd_create("rdrun-template-%d" % fd)
        saved.append(os.dup(fd))
        os.dup2(m, fd)
        caps.append(m)
    try:
        result = fn()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        texts = []
        for fd, old, m in zip((1, 2), saved, caps):
            os.dup2(old, fd)
            os.close(old)
            os.lseek(m, 0, os.SEEK_SET)
            chunks, n = [], 0
            while n < _CAPTURE_MAX:
                b = os.read(m, _CAPTURE_MAX - n)
                if not b:
                    break
                chunks.append(b)
                n += len(b)
            os.close(m)
            texts.append(b"".join(chunks))
    return result, texts


def _write_all(fd, data):
    while data:
        try:
            data = data[os.write(fd, data) :]
        except OSError:
            return


# ---- start -------------------------------------------------------------------------------
def _holds():
    """What rdrun's line says the workers are forked from: the interpreter and its imports."""
    what = ["Python %d.%d.%d" % sys.version_info[:3]]
    torch = sys.modules.get("torch")
    if torch is not None:
        what.append("torch %s" % getattr(torch, "__version__", "?"))
    what += _REQUIRED
    learned = [m for m in _LEARNED if m != "torch"]
    if learned:
        what.append("%d more modules its workers imported in an earlier run" % len(learned))
    return ", ".join(what)


_learn_init()
if _BARE and not _REQUIRED and not (_MEMORY_FILE and os.path.exists(_MEMORY_FILE)):
    # Nothing to import (the default's first run): no output to capture, no generator or
    # variable to record, and none of the modules that takes (random: ~3 ms on the way to the
    # first fork). Learned imports are recorded when they come (learn.py).
    _failed, _IMPORT_OUTPUT = _preload(), [b"", b""]
else:
    _failed, _IMPORT_OUTPUT = _captured(lambda: _recording(_preload))
if _failed is not None:
    _send("failed " + _failed)
    os._exit(0)
# The environment the imports saw (each worker's import-time variables are the same, or rdrun
# spawns it cold): what `_watch_env` compares a worker's changes with.
_TEMPLATE_ENV = dict(os.environ)
# What the imports allocated stays out of the collector's sight: a collection in a worker then
# does not touch (and copy) the pages the template shares with it. (A worker gives it back to
# the collector at exit: `_run`.)
import gc

gc.collect()
gc.freeze()
_send("ready %d %s" % (os.getpid(), _holds()))
_job = _serve()
del _failed

# From here on this is a worker (the grandchild). The user's code runs as the outermost Python
# frame (`_at_top`) called from the top level of this program, so an exception that escapes it
# is handled by the interpreter as in a cold one (traceback on stderr, exit 1; SystemExit's
# code; atexit; non-daemon threads joined).


def _main_module():
    """A `__main__` as CPython's start-up makes it (the same names, in the same order, with
    `__annotations__`); the script's own names are added by the caller."""
    import builtins
    import types
    from importlib.machinery import BuiltinImporter

    old = sys.modules["__main__"]
    m = types.ModuleType("__main__")
    d = m.__dict__
    d["__loader__"] = BuiltinImporter
    d["__annotations__"] = {}
    d["__builtins__"] = builtins
    sys.modules["__main__"] = m
    # multiprocessing aliases `__mp_main__` to `__main__` when it is imported (with torch, in
    # the template): the alias must name the worker's.
    if sys.modules.get("__mp_main__") is old:
        sys.modules["__mp_main__"] = m
    return old, m


def _run(argv):
    import atexit
    import runpy

    parsed = _parse(argv)
    if isinstance(parsed, str):
        sys.stderr.write("rdrun warm start: %s\n" % parsed)
        os._exit(2)
    kind, target, args, path0 = parsed
    sys.argv = args
    sys.orig_argv = [os.fsdecode(_ARGV0)] + argv
    _set_cmdline(argv)
    if not sys.flags.safe_path and sys.path:
        sys.path[0] = path0
    _fresh_process_state()
    # The objects gc.freeze() kept from the collector go back to it at exit, so that the
    # interpreter's last collections free them as a cold worker's do (frozen, nanobind's
    # types in triton, imported with --preload torch._dynamo, report ~50 "leaked" lines).
    # Registered before any of the user's: it runs after theirs.
    atexit.register(gc.unfreeze)
    _worker_hook(_TEMPLATE_ENV)
    _top_level_slot()
    _write_all(1, _IMPORT_OUTPUT[0])
    _write_all(2, _IMPORT_OUTPUT[1])
    keep, main = _main_module()
    try:
        if kind == "script":
            path = os.path.abspath(target)
            main.__file__ = path
            main.__cached__ = None
            from importlib.machinery import SourceFileLoader

            main.__loader__ = SourceFileLoader("__main__", path)
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec", dont_inherit=True)
            _at_top(exec, code, main.__dict__)
        elif kind == "code":
            code = compile(target, "<string>", "exec", dont_inherit=True)
            _at_top(exec, code, main.__dict__)
        elif kind == "module":
            _at_top(runpy._run_module_as_main, target, True)
        else:  # a directory or zip file with __main__.py
            _at_top(runpy._run_module_as_main, "__main__", False)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - reported as the interpreter would
        tb = _trim(e.__traceback__)
        e = e.with_traceback(tb)
        # What PyErr_Print leaves for a post-mortem debugger, then the hook, as the outermost
        # call (a hook that looks at its stack sees what it would see cold).
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = e
        _at_top(sys.excepthook, type(e), e, tb)
        if isinstance(e, KeyboardInterrupt):
            # A cold interpreter ends an uncaught KeyboardInterrupt by dying of SIGINT.
            import signal

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1)
    del keep


_run(_job)
