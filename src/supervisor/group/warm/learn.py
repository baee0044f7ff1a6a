# rdrun's warm-start template: the learned preload (docs/warm-start.md "Learned preload"). Sent
# with topframe.py and template.py as one program (process.rs TEMPLATE_PY); only definitions
# here: template.py calls them (its globals, such as _OPTS, _PATH0 and _note, are read at call
# time).
#
# Worker side (`_worker_hook`, installed before the user's code): one audit hook. On "import"
# (raised before a module that is not in sys.modules yet is looked for) it appends the module's
# name to LEARN_DIR/<pid>: the first import after a quiet 50 ms at once, the rest of a burst in
# batches, the remainder at exit. On `os.putenv`/`os.unsetenv` it warns when the variable was
# already read by the template's imports, and reports the import-time ones as "=NAME=VALUE".
# Template side (`_learn_step`, between requests, never while one waits): read the reports,
# try the new names in a disposable child at idle priority (the trial: the rules below), import
# those that passed here, one module per step so that a fork request waits for one module at
# most, and remember the list for the next run of the same job (`_remember`).
#
# The rules: a module is preloaded only when it is installed code (under a site-packages
# directory or the interpreter's prefix, never under the script's directory, the working
# directory or a PYTHONPATH entry outside site-packages: the user's code), imports cleanly, and
# leaves the process fork-safe (no thread that `_unsafe_threads` does not know, CUDA not
# initialised, no /dev/nvidia* or /dev/kfd open). A module that breaks one is named once (an
# INFO line of rdrun's) and never tried again in this run.
import os
import sys

_LEARN_DIR = None
_MEMORY_FILE = None
_learn_offsets = {}
_learn_seen = set()
_learn_queue = []
_trial = None  # [pid, read fd, names, bytes read, start time]
_proven = []  # names that passed the trial, to import here
_trial_done = set()  # names the running trial reported on
_LEARNED = []  # imported here because the workers import them (what `_remember` keeps)
_SKIPPED = {}  # name -> why it is never preloaded in this run
_ADOPTED = {}  # import-time variables the workers set, in this template's environment
_STALE = {}  # ... that the workers set after this template had imported what reads them
_TAINTED = None  # why this template must not fork any more (a learned import broke a rule)
_CAN_IDLE = False
_rules = None
# How long one trial may take before its child is killed (an import that never returns); paced
# (pace.py), importing torch and DDP's modules takes a minute on a busy node.
_TRIAL_LIMIT = 600.0
# The template starts a trial only once no new name was reported for this long: the workers'
# import bursts (`import torch`, DDP's constructor) are over, so that learning never competes
# with a launch's own imports (measured: a first launch was 15 % slower than cold with the
# trial running beside the workers' imports).
_QUIET = 1.0
_last_new = 0.0
# Remembered lists kept at most (the oldest are removed).
_MEMORY_KEEP = 64
# Variables a script may set before `import torch` that the imports read: C libraries at load
# (template.py _LOAD_TIME_PREFIXES) and torch's own settings. Others are never adopted.
_ADOPTABLE = ("TORCH_", "PYTORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_")


def _learn_init():
    """Template side, at start: where the reports and the memory are; whether the template's
    own imports of learned modules can run at idle priority (it must get back to normal
    before it forks: workers inherit the policy)."""
    global _LEARN_DIR, _MEMORY_FILE, _CAN_IDLE
    _LEARN_DIR = _OPTS.get("learn") or None
    # The job's remembered list: rdrun names the file (a hash of the interpreter and the
    # script's path, learned.rs `memory_file`), so no hash module is imported on the way to the
    # first fork.
    _MEMORY_FILE = (_OPTS.get("memory") or None) if _LEARN_DIR else None
    _CAN_IDLE = _idle_reversible()
    _rule_dirs()  # now, in the template's working directory (workers read it too)


def _idle_reversible():
    """Whether this process may go to SCHED_IDLE and back (root, CAP_SYS_NICE, or RLIMIT_NICE
    allowing nice 0): tried once, and only when predicted, since an unprivileged process
    cannot leave SCHED_IDLE."""
    try:
        import resource

        allowed = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20
        if not allowed:
            return False
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError, ImportError, ValueError):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        # Stuck at idle priority: every worker would inherit it. No warm start then.
        _send("failed cannot leave the idle scheduling policy it tried")
        os._exit(0)
    return True


# ---- memory across runs --------------------------------------------------------------------
def _fingerprint():
    """What the remembered list depends on: the interpreter, its prefix, the installed packages
    (each site-packages directory's mtime changes when a package is added, removed or
    upgraded) and the script file (an edit may change what it imports or sets)."""
    parts = ["rdrun learned preload 1", sys.version, os.path.realpath(sys.executable), sys.prefix]
    for d in sorted(p for p, ok in _rule_dirs() if ok):
        try:
            parts.append("%s %d" % (d, os.stat(d).st_mtime_ns))
        except OSError:
            parts.append(d)
    script = _OPTS.get("script")
    if script:
        try:
            st = os.stat(script)
            parts.append("%s %d %d" % (script, st.st_mtime_ns, st.st_size))
        except OSError:
            parts.append(script)
    return "\n".join(parts)


def _remembered():
    """(modules, variables) remembered for this job, when the fingerprint still matches."""
    if _MEMORY_FILE is None or not os.path.exists(_MEMORY_FILE):
        return [], {}
    import json

    try:
        with open(_MEMORY_FILE) as f:
            data = json.load(f)
        if data.get("fingerprint") != _fingerprint():
            return [], {}
        mods = [
            m
            for m in data.get("modules", []) + data.get("proven", [])
            if isinstance(m, str) and _is_module_name(m)
        ]
        env = {
            k: v
            for k, v in data.get("env", {}).items()
            if isinstance(k, str) and isinstance(v, str) and k.startswith(_adoptable())
        }
        return mods, env
    except (OSError, ValueError, AttributeError, TypeError):
        return [], {}


def _remember():
    if _MEMORY_FILE is None:
        return
    import json

    env = dict(_ADOPTED)
    env.update(_STALE)
    # "modules": what this template imported; "proven": what the trial proved (in a copy of
    # this very template) and this one has yet to import. The next run's template imports both
    # at start.
    proven = [n for n in _proven if n not in _LEARNED]
    data = {"fingerprint": _fingerprint(), "modules": _LEARNED, "proven": proven, "env": env}
    directory = os.path.dirname(_MEMORY_FILE)
    tmp = "%s.%d.tmp" % (_MEMORY_FILE, os.getpid())
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, _MEMORY_FILE)
        names = [os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".json")]
        if len(names) > _MEMORY_KEEP:
            names.sort(key=lambda p: os.stat(p).st_mtime)
            for old in names[: len(names) - _MEMORY_KEEP]:
                os.unlink(old)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _is_module_name(name):
    return all(p.isidentifier() for p in name.split("."))


def _adoptable():
    return _LOAD_TIME_PREFIXES + _ADOPTABLE


# ---- the rules -------------------------------------------------------------------------------
def _rule_dirs():
    """(directory, allowed): site-packages and the interpreter's prefixes are installed code,
    the script's directory, the working directory and PYTHONPATH entries are the user's. The
    deepest directory that holds a file decides (a venv inside the project is installed code;
    the project inside a prefix is the user's)."""
    global _rules
    if _rules is None:
        import site

        sites = set(
            p for p in sys.path if p and os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages")
        )
        try:
            sites.update(site.getsitepackages())
        except Exception:  # noqa: BLE001
            pass
        try:
            sites.add(site.getusersitepackages())
        except Exception:  # noqa: BLE001
            pass
        site_like = ("site-packages", "dist-packages")
        user = {_PATH0, os.getcwd()} | set(
            p
            for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if os.path.basename(os.path.normpath(p)) not in site_like
        )
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        rules = [(os.path.realpath(d), True) for d in sites if d]
        rules += [(os.path.realpath(d), False) for d in user if d]
        rules += [(os.path.realpath(d), True) for d in prefixes if d]
        _rules = rules
    return _rules


def _installed(path):
    p = os.path.realpath(path)
    best = None
    for d, ok in _rule_dirs():
        if p == d or p.startswith(d.rstrip(os.sep) + os.sep):
            # Deepest wins; at equal depth the user's (never preload in doubt).
            if best is None or len(d) > len(best[0]) or (len(d) == len(best[0]) and not ok):
                best = (d, ok)
    return best is not None and best[1]


def _origin_breach(name):
    """Why `name` (or a package above it not imported yet) is not installed code; imports the
    packages above it (their rules checked first), as find_spec of a submodule needs them."""
    import importlib
    import importlib.util

    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in sys.modules:
            continue
        spec = importlib.util.find_spec(prefix)
        if spec is None:
            return None  # the import below says that it is not found
        places = list(spec.submodule_search_locations or ()) if spec.origin in (None, "namespace") else []
        if spec.has_location and spec.origin:
            places.append(spec.origin)
        for place in places:
            if not _installed(place):
                return "%s is the user's code (%s), not an installed package" % (prefix, place)
        if i < len(parts):
            importlib.import_module(prefix)
    return None


def _fork_breach():
    """Why this process may not fork any more, or None: a thread not known to be fork-safe,
    CUDA initialised, a GPU device open."""
    why = _unsafe_threads()
    if why is not None:
        return why
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None:
        try:
            if cuda.is_initialized():
                return "CUDA is initialised"
        except Exception:  # noqa: BLE001
            pass
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink("/proc/self/fd/" + fd)
            except OSError:
                continue
            if target.startswith(("/dev/nvidia", "/dev/kfd", "/dev/dri")):
                return "a GPU device is open (%s)" % target
    except OSError:
        pass
    return None


def _user_module(names):
    for m in sorted(names):
        f = getattr(sys.modules.get(m), "__file__", None)
        # (Only a real path: torch.classes, a namespace object, says "_classes.py".)
        if isinstance(f, str) and os.path.isabs(f) and not _installed(f):
            return "it imports %s from %s, the user's code" % (m, f)
    return None


def _one_line(e):
    text = str(e).strip().splitlines()
    return "%s: %s" % (type(e).__name__, text[0][:200] if text else "")


def _set_idle():
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        try:
            os.nice(19)
        except OSError:
            pass


# ---- template side ---------------------------------------------------------------------------
def _learn_step(sock):
    """One bounded step of learning (at most one module's import, or a 0.25 s wait for
    reports); False when a request waits or the template does not learn: the caller reads it."""
    import select
    import time

    if _LEARN_DIR is None:
        return False
    watch = [sock] + ([_trial[1]] if _trial else [])
    # The proven names are imported once the trial is over (it reports them as it goes).
    timeout = 0 if _proven and _trial is None else 0.25
    ready = select.select(watch, [], [], timeout)[0]
    if sock in ready:
        return False
    if _trial is not None:
        if _trial[1] in ready:
            _trial_read()
        elif time.monotonic() - _trial[4] > _TRIAL_LIMIT:
            try:
                os.kill(_trial[0], 9)
            except OSError:
                pass
        return True
    if _proven:
        _import_proven()
        return True
    _read_reports()
    if _learn_queue and _TAINTED is None and time.monotonic() - _last_new >= _QUIET:
        _start_trial()
    return True


def _read_reports():
    global _last_new
    import time

    try:
        names = os.listdir(_LEARN_DIR)
    except OSError:
        return
    for n in names:
        off = _learn_offsets.get(n, 0)
        try:
            with open(os.path.join(_LEARN_DIR, n), "rb") as f:
                f.seek(off)
                data = f.read(1 << 20)
        except OSError:
            continue
        end = data.rfind(b"\n") + 1
        _learn_offsets[n] = off + end
        for line in data[:end].split(b"\n"):
            text = line.decode("utf-8", "replace").strip()
            if not text:
                continue
            if text.startswith("="):
                _env_report(text[1:])
            elif text not in _learn_seen and _is_module_name(text):
                _learn_seen.add(text)
                if text not in sys.modules and text not in _SKIPPED:
                    _learn_queue.append(text)
                    _last_new = time.monotonic()


def _env_report(text):
    """A worker set an import-time variable: adopt it before the imports that read it, or, when
    the template imported them already, fork no more warm workers in this run (the next run's
    template adopts it from the memory)."""
    k, _, v = text.partition("=")
    if not k.startswith(_adoptable()) or _TEMPLATE_ENV.get(k) == v or k in _STALE:
        return
    read = k in _READ_AT_IMPORT or (
        k.startswith(_LOAD_TIME_PREFIXES) and ("torch" in sys.modules or "numpy" in sys.modules)
    )
    if k in _ADOPTED or read:
        _STALE[k] = v
        _note(
            "info",
            "the workers set %s=%r after the fork, and the template had already imported what "
            "reads it (with %r): the next workers of this run start cold; the next run's template "
            "imports with %r" % (k, v, _TEMPLATE_ENV.get(k), v),
        )
    else:
        os.environ[k] = v
        _TEMPLATE_ENV[k] = v
        _ADOPTED[k] = v
        _note(
            "info",
            "the workers set %s=%r before importing what reads it: the template imports with "
            "that value too" % (k, v),
        )
    _remember()


def _start_trial():
    global _trial
    import time

    names = [n for n in _learn_queue if n not in sys.modules and n not in _SKIPPED]
    del _learn_queue[:]
    if not names or _unsafe_threads() is not None:
        return
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _trial_child(names, w, me)
        finally:
            os._exit(0)
    os.close(w)
    _trial = [pid, r, names, b"", time.monotonic()]


def _trial_child(names, w, template):
    """In a disposable copy of the template: import each name as the template would, at idle
    priority, checking the rules; one line per name as it goes ("ok NAME", "gone NAME": not
    found, as in the worker; "skip NAME\\tWHY"). Stops at the first that breaks fork safety
    (this copy is then unsafe itself): the names after it are tried again later."""
    import ctypes
    import importlib

    # It dies with the template (rdrun ends the template with SIGKILL; an orphaned trial would
    # be left to the run's cgroup and watchdog).
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != template:
        os._exit(0)
    _sock.close()
    _set_idle()
    nul = os.open(os.devnull, os.O_WRONLY)
    os.dup2(nul, 1)
    os.dup2(nul, 2)
    for name in names:
        if name in sys.modules:
            _write_all(w, ("ok %s\n" % name).encode())
            continue
        before = set(sys.modules)
        line, stop = None, False
        try:
            why = _paced(lambda: _origin_breach(name), None)
            if why is None:
                _paced(lambda: importlib.import_module(name), None)
        except ModuleNotFoundError as e:
            # Not found (itself or a package above it): the worker's import failed too.
            missing = e.name == name or name.startswith("%s." % e.name)
            why = None if missing else "import failed: " + _one_line(e)
            if why is None:
                line = "gone %s\n" % name
        except BaseException as e:  # noqa: BLE001
            why = "import failed: " + _one_line(e)
        if line is None and why is None:
            why = _fork_breach()
            stop = why is not None
            why = why or _user_module(set(sys.modules) - before)
            stop = stop or why is not None
        if line is None:
            line = "ok %s\n" % name if why is None else "skip %s\t%s\n" % (name, why.replace("\n", " "))
        _write_all(w, line.encode("utf-8", "replace"))
        if stop:
            break
    os._exit(0)


def _trial_read():
    """Reads what the trial wrote so far: each name it proved is remembered at once (paced on a
    busy node, learning may outlast a short job: what was proven is not lost with it)."""
    global _trial
    pid, fd, names, buf, _start = _trial
    data = os.read(fd, 65536)
    if data:
        buf += data
        end = buf.rfind(b"\n") + 1
        _trial[3] = buf[end:]
        if _trial_lines(buf[:end]):
            _remember()
        return
    os.close(fd)
    status = 0
    try:
        status = os.waitpid(pid, 0)[1]
    except ChildProcessError:
        pass
    _trial = None
    _trial_lines(buf)
    rest = [n for n in names if n not in _trial_done]
    _trial_done.clear()
    if rest and status != 0:
        # It died importing the first one it did not report.
        _skip(rest[0], "importing it ended the trial process (wait status %d)" % status)
        rest = rest[1:]
    _learn_queue.extend(rest)


def _trial_lines(buf):
    """Takes the trial's complete lines; True when a name was proven."""
    proven = False
    for line in buf.decode("utf-8", "replace").splitlines():
        kind, _, rest = line.partition(" ")
        name, _, why = rest.partition("\t")
        _trial_done.add(name)
        if kind == "ok":
            _proven.append(name)
            proven = True
        elif kind == "skip":
            _skip(name, why)
    return proven


def _skip(name, why):
    if name in _SKIPPED:
        return
    _SKIPPED[name] = why
    _note("info", "%s is not preloaded: %s" % (name, why))


def _import_proven():
    """Imports the next name that passed the trial (at idle priority where the template can get
    back from it); after the last one, checks fork safety, freezes what was allocated and
    remembers the list."""
    global _TAINTED
    import importlib

    name = _proven.pop(0)
    if name not in sys.modules:
        if _CAN_IDLE:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        try:
            failed, out = _captured(
                lambda: _recording(lambda: _paced(lambda: _try_import(importlib, name), _sock))
            )
        finally:
            if _CAN_IDLE:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        _IMPORT_OUTPUT[0] += out[0]
        _IMPORT_OUTPUT[1] += out[1]
        if failed is not None:
            _skip(name, failed)
        else:
            _LEARNED.append(name)
    if _proven:
        return
    why = _fork_breach()
    if why is not None:
        _TAINTED = "a learned import left it unsafe to fork: %s" % why
        _note("warn", "the template interpreter will fork no more workers: " + _TAINTED)
        return
    import gc

    gc.collect()
    gc.freeze()
    _remember()
    if _LEARNED:
        shown = ", ".join(_LEARNED[:3]) + (" and %d more" % (len(_LEARNED) - 3) if len(_LEARNED) > 3 else "")
        _note("info", "the template holds %d module%s the workers imported: %s" % (len(_LEARNED), "" if len(_LEARNED) == 1 else "s", shown))


def _try_import(importlib, name):
    try:
        importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001
        return "import failed in the template: " + _one_line(e)
    return None


def _preload_remembered():
    """At start, after --preload: what the workers of this job imported in an earlier run (and
    the import-time variables they set), when nothing it depends on changed. A failure is no
    error here (the list is relearned)."""
    import importlib

    mods, env = _remembered()
    for k, v in env.items():
        os.environ[k] = v
        _ADOPTED[k] = v
    for name in mods:
        if name in sys.modules:
            if name not in _LEARNED:
                _LEARNED.append(name)
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - relearned in this run
            continue
        _LEARNED.append(name)
    _learn_seen.update(_LEARNED)


def _set_by_user_code():
    """Whether the os.environ write being audited comes from the user's code, not from an
    installed package (numpy sets OPENBLAS_MAIN_FREE, inductor TORCHINDUCTOR_CACHE_DIR): only
    the user's settings are adopted. The first frame outside os and collections.abc decides."""
    f = sys._getframe(2)
    skip = (os.__dict__, sys.modules["_collections_abc"].__dict__)
    while f is not None and (f.f_globals is skip[0] or f.f_globals is skip[1]):
        f = f.f_back
    if f is None:
        return False
    name = f.f_code.co_filename
    return not (os.path.isabs(name) and _installed(name))


def _fork_refusal():
    """Why the template answers `cold` to a fork request, or None."""
    if _TAINTED is not None:
        return _TAINTED
    if _STALE:
        k, v = next(iter(_STALE.items()))
        return (
            "the workers set %s=%r after the fork, and the template had imported torch with %r"
            % (k, v, os.environ.get(k))
        )
    return None


# ---- worker side -----------------------------------------------------------------------------
def _worker_hook(template_env):
    """In a worker: the one audit hook (see the top of this file). Reports go to the learn
    directory (nothing when the template does not learn); the variable warning is printed once
    per variable on stderr, only when the template's imports read it: a variable set before
    `import torch` in a worker whose torch is its own (the template had not imported it) has
    its effect, as in a cold worker."""
    import atexit
    from time import monotonic

    me = os.getpid()
    said = set()
    read = frozenset(_READ_AT_IMPORT)
    libs = "torch" in sys.modules or "numpy" in sys.modules
    path = os.path.join(_LEARN_DIR, str(me)) if _LEARN_DIR else None
    adoptable = _adoptable()
    buf = []
    last = [0.0]
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC

    def flush():
        if not buf or os.getpid() != me:
            return
        data = ("\n".join(buf) + "\n").encode("utf-8", "replace")
        del buf[:]
        try:
            fd = os.open(path, flags, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError:
            pass

    def hook(event, args):
        if event == "import":
            if path is None or os.getpid() != me:
                return
            try:
                buf.append(args[0])
                now = monotonic()
                if now - last[0] > 0.05 or len(buf) >= 256:
                    last[0] = now
                    flush()
            except Exception:  # noqa: BLE001 - a hook that raises fails the import itself
                pass
            return
        if event != "os.putenv" and event != "os.unsetenv":
            return
        try:
            if os.getpid() != me:
                return  # a DataLoader worker forked from this one: torch is imported there cold too
            key = os.fsdecode(args[0])
            value = os.fsdecode(args[1]) if event == "os.putenv" else None
            # Reported for adoption only while it can still have its effect here, as in a
            # cold worker: before this worker imported torch or numpy (whose import reads it).
            if (
                path is not None
                and value is not None
                and key.startswith(adoptable)
                and "torch" not in sys.modules
                and "numpy" not in sys.modules
                and "\n" not in key + value
                and _set_by_user_code()
            ):
                buf.append("=%s=%s" % (key, value))
                flush()
            if key in said or not (key in read or (libs and key.startswith(_LOAD_TIME_PREFIXES))):
                return
            old = template_env.get(key)
            if value == old:
                return
            said.add(key)
            sys.stderr.write(
                "rdrun warm start: %s was %s after this worker was forked from a template "
                "interpreter that had imported torch (and the preloaded modules) with %s: it has "
                "no effect on them here, unlike in a cold worker that changes it before "
                "`import torch`. Set it in rdrun's environment, or use --warm-start off.\n"
                % (
                    key,
                    "unset" if value is None else "set to %r" % value,
                    "it unset" if old is None else "%r" % old,
                )
            )
        except Exception:  # noqa: BLE001 - an audit hook that raises fails the write itself
            pass

    sys.addaudithook(hook)
    if path is not None:
        atexit.register(flush)
