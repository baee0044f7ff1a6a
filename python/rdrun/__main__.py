"""``python -m rdrun ARGS``: exec the installed ``rdrun`` binary with the same arguments.

No launcher logic here: the process becomes rdrun (same PID), so a signal sent to it reaches
rdrun and its exit status is rdrun's, as with ``python -m torch.distributed.run``.
"""

import os
import signal
import sys

from rdrun import find_rdrun_bin


def main():
    try:
        path = find_rdrun_bin()
    except FileNotFoundError as e:
        sys.stderr.write("rdrun: error: %s\n" % e)
        return 1
    # Python ignores SIGPIPE and SIGXFSZ at start-up, and an ignored signal stays ignored across
    # exec: rdrun and every worker would inherit that. Back to the default rdrun expects.
    for name in ("SIGPIPE", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, [path] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write("rdrun: error: cannot run %s: %s\n" % (path, e.strerror or e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
