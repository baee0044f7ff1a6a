# rdrun's warm-start template: the pace of learning (sent before learn.py, process.rs
# TEMPLATE_PY; only definitions).
#
# Why: the template learns while the workers train. At idle priority it takes no CPU time they
# want, but importing torch touches hundreds of MiB: on a node whose cores the ranks keep busy,
# the trial's and the template's imports slowed a 2-rank CPU job by a fifth for the seconds
# they took (docs/benchmarks.md). So the imports of learning run in a paced mode: a finder at
# the head of sys.meta_path (there only while learning imports, never when a worker is forked)
# is called before every module is looked for, and there it
#   * goes on at full speed when a fork request is waiting (the template's socket is readable:
#     the workers are down, and the request must not wait for a slow import; the import also
#     leaves SCHED_IDLE then, `_Pacer._hurry`) or when the node
#     has cores to spare (/proc/stat: the other processes leave >= _SPARE_CORES idle);
#   * otherwise sleeps until its CPU time is at most _DUTY of the time it has been learning,
#     waking at once for a fork request.
# The cost to the job is then spread thin (about _DUTY of what it was), at the price of learning
# taking longer on a busy node; one module's own execution (a C extension's load) is not split.
_DUTY = 0.05
_SPARE_CORES = 1.0
# How often the node's idle time is read again.
_SPARE_EVERY = 0.2


def _cpu_stat():
    """(busy, total) jiffies of the whole node, from /proc/stat's first line."""
    with open("/proc/stat", "rb") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


class _Pacer:
    """A meta-path finder that finds nothing: it only waits (see above)."""

    def __init__(self, sock):
        # Imported here, before the finder is in place: an import inside find_spec would call
        # find_spec again.
        import select
        import time

        self.select, self.time = select.select, time
        self.busy = False  # in find_spec: a nested call (none expected) goes through
        self.sock = sock
        self.wall0 = time.monotonic()
        self.cpu0 = time.process_time()
        self.hurry = False
        self.spare = False
        self.seen = None  # (wall, own cpu, node busy jiffies) when the node was last read
        try:
            self.hz = os.sysconf("SC_CLK_TCK")
            self.ncpu = os.cpu_count() or 1
        except (OSError, ValueError):
            self.hz = 0

    def _request_waits(self, timeout):
        if self.sock is None:
            if timeout > 0:
                self.time.sleep(timeout)
            return False
        try:
            return bool(self.select([self.sock], [], [], timeout)[0])
        except (OSError, ValueError):
            return True

    def _node_has_spare(self, now, cpu):
        if not self.hz:
            return False
        try:
            busy = _cpu_stat()[0]
        except (OSError, ValueError, IndexError):
            return False
        seen, self.seen = self.seen, (now, cpu, busy)
        if seen is None or now - seen[0] <= 0:
            return self.spare
        others = ((busy - seen[2]) / self.hz - (cpu - seen[1])) / (now - seen[0])
        self.spare = self.ncpu - others >= _SPARE_CORES
        return self.spare

    def find_spec(self, name, path=None, target=None):
        if self.hurry or self.busy:
            return None
        self.busy = True
        try:
            self._wait()
        finally:
            self.busy = False
        return None

    def _hurry(self):
        # A fork request waits: the rest of this import runs at full speed, and at normal
        # priority. An import left at SCHED_IDLE (learn.py `_import_proven`) on a node whose
        # cores are all busy gets almost no CPU, and the agent's one thread waits for the fork:
        # for seconds, past a multi-node round's heartbeats (5 missed: the node is dropped).
        self.hurry = True
        try:
            if os.sched_getscheduler(0) == os.SCHED_IDLE:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except (OSError, AttributeError):
            pass

    def _wait(self):
        time = self.time
        if self._request_waits(0):
            self._hurry()
            return
        while True:
            now, cpu = time.monotonic(), time.process_time()
            if self.seen is None or now - self.seen[0] >= _SPARE_EVERY:
                self._node_has_spare(now, cpu)
            if self.spare:
                return
            owed = (cpu - self.cpu0) / _DUTY - (now - self.wall0)
            if owed <= 0:
                return
            if self._request_waits(min(owed, _SPARE_EVERY)):
                self._hurry()
                return


_PACER = None  # this process's pacer: its reading of the node outlives one module's import


def _paced(fn, sock):
    """fn() with the imports it makes paced (above). The node's last reading and verdict are
    kept from one call to the next (a fresh pacer knows nothing for its first _SPARE_EVERY and
    paces: the trial's hundreds of names would each pay that); the CPU budget and the hurry
    start anew."""
    global _PACER
    import time

    pacer = _PACER
    if pacer is None:
        pacer = _PACER = _Pacer(sock)
    pacer.sock, pacer.hurry = sock, False
    pacer.wall0, pacer.cpu0 = time.monotonic(), time.process_time()
    sys.meta_path.insert(0, pacer)
    try:
        return fn()
    finally:
        try:
            sys.meta_path.remove(pacer)
        except ValueError:
            pass
