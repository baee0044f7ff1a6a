"""rdrun: a drop-in replacement for PyTorch's torchrun, written in Rust.

This package holds no launcher code: the wheel installs the ``rdrun`` binary into the
environment's scripts directory (``bin/``), and ``python -m rdrun ARGS`` replaces the Python
process with that binary (``os.execv``), so arguments, exit status and signals are rdrun's own.
"""

import os
import sys
import sysconfig

__all__ = ["find_rdrun_bin"]


def _candidates():
    """Where the wheel that installed this package put its ``rdrun``, most likely first."""
    seen = set()
    dirs = [sysconfig.get_path("scripts")]
    # A `pip install --user` puts scripts in the user scheme's directory.
    user_scheme = {"posix": "posix_user", "nt": "nt_user"}.get(os.name)
    if user_scheme and user_scheme in sysconfig.get_scheme_names():
        dirs.append(sysconfig.get_path("scripts", user_scheme))
    # Beside the interpreter (a venv's bin/ when sysconfig was pointed elsewhere).
    dirs.append(os.path.dirname(os.path.abspath(sys.executable)))
    for d in dirs:
        if d and d not in seen:
            seen.add(d)
            yield os.path.join(d, "rdrun.exe" if os.name == "nt" else "rdrun")


def find_rdrun_bin():
    """The path of the ``rdrun`` binary installed with this package.

    Not ``shutil.which``: an ``rdrun`` elsewhere on PATH may be another version than this
    package's. Raises ``FileNotFoundError`` naming the directories looked in.
    """
    looked = []
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        looked.append(os.path.dirname(path))
    raise FileNotFoundError(
        "the rdrun binary is not installed beside this Python package (looked in %s); "
        "reinstall it: pip install --force-reinstall rdrun" % ", ".join(looked)
    )
