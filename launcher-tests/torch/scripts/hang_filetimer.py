"""torch's own FileTimer watchdog, as a user script arms it (issue 13).

Every worker configures `FileTimerClient(TORCHELASTIC_TIMER_FILE)` and writes
`<out>/pid_rank<R>_attempt<A>.txt` = "<pid> <TORCHELASTIC_TIMER_FILE>". On attempt 0, rank 1
sleeps 120 s inside `expires(after=2)`: the watchdog must kill it (if it comes out, it writes
`<out>/not_killed_rank1.txt` and exits 3); rank 0 passes a short `expires(after=30)` block and
then sleeps, waiting to be stopped. On later attempts both ranks pass a short block and write
`<out>/done_rank<R>.txt` = "<attempt>".
"""
import os
import sys
import time

from torch.distributed.elastic import timer

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
path = os.environ["TORCHELASTIC_TIMER_FILE"]
timer.configure(timer.FileTimerClient(path))


def note(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(out, name))


note(f"pid_rank{rank}_attempt{restart}.txt", f"{os.getpid()} {path}\n")
if restart == 0:
    if rank == 1:
        with timer.expires(after=2, scope="hang_filetimer/slow"):
            time.sleep(120)
        note("not_killed_rank1.txt", "1\n")
        sys.exit(3)
    with timer.expires(after=30, scope="hang_filetimer/quick"):
        time.sleep(0.2)
    time.sleep(120)  # stopped by the launcher (rdrun); orphaned by torchrun
    sys.exit(0)

with timer.expires(after=30, scope="hang_filetimer/quick"):
    time.sleep(0.2)
note(f"done_rank{rank}.txt", f"{restart}\n")
