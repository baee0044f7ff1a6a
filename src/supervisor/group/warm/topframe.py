# The outermost frame for a warm worker's code (docs/warm-start.md "Parity"): a part of the
# warm-start template program, sent ahead of template.py as one program (process.rs
# TEMPLATE_PY); kept apart because it is one job of its own, the one place that touches the
# interpreter's thread state.
import os
import sys

# ---- the outermost frame -----------------------------------------------------------------
# A cold interpreter runs the script from C with no Python frame below it: at its top level
# `sys._getframe().f_back` is None, `inspect.stack()` has one entry, `warnings.warn(...,
# stacklevel=2)` reports `sys:1`. Python cannot call a function with an empty frame stack, so
# the worker empties it for the call: CPython (3.11 and later) links a new frame to the thread's
# "current frame" word when an evaluation loop starts (a call from C: exec, a partial); set to
# NULL for the call and restored after it, the user's code starts a new, empty stack. The word
# is found by its value (this frame's interpreter frame) in the thread state, or in the struct
# its first words point to (3.11/3.12: tstate->cframe->current_frame; 3.13+:
# tstate->current_frame), read through /proc/self/mem (a bad address is an error, not a
# crash). Stale memory can hold the same value (3.12+: the frame of a callee that returned,
# just above the data stack's top, links to this one), so each place found is tried: the one
# where a trial call sees no frame below it is kept. None passing (3.10, a free-threaded build,
# another layout): the code runs nested, the template's frames below it.
_SLOT = None


def _iframe(frame):
    """The address of `frame`'s interpreter frame (PyFrameObject.f_frame: after the object
    head and f_back)."""
    import ctypes

    return ctypes.c_void_p.from_address(
        id(frame) + object.__basicsize__ + ctypes.sizeof(ctypes.c_void_p)
    ).value


def _frame_slots():
    """The addresses that hold this frame's interpreter frame: this thread's current-frame word
    among them when the layout is one described above."""
    if sys.version_info < (3, 11) or sys.implementation.name != "cpython" or "t" in sys.abiflags:
        return []
    import ctypes

    size = ctypes.sizeof(ctypes.c_void_p)
    get = ctypes.pythonapi.PyThreadState_Get
    get.restype = ctypes.c_void_p
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    found = []
    try:
        # No Python call between here and the scan's end (the current frame must stay this one):
        # only builtins and methods implemented in C.
        me = _iframe(sys._getframe())
        tstate = get()
        data = os.pread(fd, 64 * size, tstate)
        for off in range(0, len(data) - size + 1, size):
            word = int.from_bytes(data[off : off + size], sys.byteorder)
            if word == me:
                found.append(tstate + off)
            elif word >= 65536:
                try:
                    inner = os.pread(fd, 2 * size, word)
                except (OSError, OverflowError, ValueError):
                    continue
                for off2 in range(0, len(inner) - size + 1, size):
                    if int.from_bytes(inner[off2 : off2 + size], sys.byteorder) == me:
                        found.append(word + off2)
    except (OSError, OverflowError, ValueError):
        return []
    finally:
        os.close(fd)
    return found


def _at_top(fn, *args):
    """fn(*args) as the outermost Python call of the thread (see above), when `_SLOT` is known."""
    import ctypes
    import functools

    # A call through a partial (C) starts a new evaluation loop in every version: a Python
    # function called directly may be run inline in this one, linked to this frame.
    call = functools.partial(fn, *args)
    if _SLOT is None:
        return call()
    word = ctypes.c_void_p.from_address(_SLOT)
    me = _iframe(sys._getframe())
    if word.value != me:
        return call()
    word.value = None
    try:
        return call()
    finally:
        word.value = me


_TOP_CHECK = compile("import sys\nok = sys._getframe().f_back is None", "<rdrun>", "exec")


def _top_level_slot():
    """`_SLOT` for this worker: the first place found where `_at_top` ran a trial at the top
    (a wrong one holds another value by then, or its trial sees frames below it, and `_at_top`
    puts back what it changed); else None."""
    global _SLOT
    for slot in _frame_slots():
        _SLOT = slot
        trial = {}
        try:
            _at_top(exec, _TOP_CHECK, trial)
        except Exception:  # noqa: BLE001
            trial = {}
        if trial.get("ok") is True:
            return _SLOT
    _SLOT = None
    return None


def _trim(tb):
    """The traceback from the first frame that is not the template's (what a cold interpreter
    shows: the user's, and runpy's for -m as in `python -m`)."""
    mine = globals()
    while tb is not None and tb.tb_frame.f_globals is mine:
        tb = tb.tb_next
    return tb


