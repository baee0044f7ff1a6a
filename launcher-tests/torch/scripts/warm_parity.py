"""Warm-start parity probe (test_warm_parity.py): what a worker draws and sees for itself.

Writes <out>/r<RANK>.a<TORCHELASTIC_RESTART_COUNT>.json with three groups of values:
- "drawn": per-process random states and secrets, which must differ between ranks and attempts
  (Python's `random`, numpy's legacy global state, torch's default generator: initial_seed,
  rand, a dropout mask, a shuffled DataLoader's first batch and a DataLoader worker's seed,
  multiprocessing's authkey; with --dynamo also sympy's generators);
- "seeded": the same draws after torch.manual_seed / random.seed / numpy.random.seed, which must
  be the same everywhere;
- "frame": the top-level frame and `__main__` as the interpreter made them (must match a cold
  worker exactly).
Then it sets OMP_NUM_THREADS (twice) as a script that wants more threads would, and PATH. Rank 1 fails
on attempt 0 once every rank wrote its record; rank 0 then waits there to be stopped.

The module has no annotated assignment at its top level on purpose: one would create
`__annotations__` itself, and `__annotations__` must come from the interpreter.
"""
import builtins
import inspect
import os
import sys

# Whether torch came with the process (a worker forked from a template that holds it).
torch_held = "torch" in sys.modules
import threading
import traceback
import warnings

try:
    annotations_at_start = repr(__annotations__)
except NameError as e:
    annotations_at_start = "NameError: %s" % e
stack_at_top = len(inspect.stack())
f_back_is_none = sys._getframe().f_back is None
extracted = [(os.path.basename(f.filename), f.name) for f in traceback.extract_stack()]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    warnings.warn("probe at the caller", stacklevel=2)
    warnings.warn("probe here", stacklevel=1)
warned = ["%s:%s" % (os.path.basename(w.filename), w.lineno) for w in caught]
main_names = [k for k in globals() if k.startswith("__")]


def depth():
    return len(inspect.stack())


import json  # noqa: E402 - after the probes of the module's first state
import random  # noqa: E402
import multiprocessing  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, get_worker_info  # noqa: E402

out_dir = sys.argv[sys.argv.index("--out") + 1]
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


class WorkerSeed(Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return get_worker_info().seed


def draws():
    """The same draws, in the same order, for both groups."""
    mask = torch.nn.functional.dropout(torch.ones(32), p=0.5, training=True) != 0
    loader = DataLoader(torch.arange(64), batch_size=8, shuffle=True)
    worker_seed = next(iter(DataLoader(WorkerSeed(), batch_size=None, num_workers=1)))
    return dict(
        random=random.random(),
        numpy=float(numpy.random.rand()),
        torch_rand=torch.rand(4).tolist(),
        torch_randn=torch.randn(2).tolist(),
        dropout_mask="".join("1" if b else "0" for b in mask.tolist()),
        shuffled_first_batch=next(iter(loader)).tolist(),
        dataloader_worker_seed=int(worker_seed),
    )


drawn = dict(torch_initial_seed=torch.initial_seed(), **draws())
drawn["authkey"] = multiprocessing.current_process().authkey.hex()
if "--dynamo" in sys.argv:
    import torch._dynamo  # noqa: F401 - imports sympy, whose generators are seeded at import

    sympy_random = sys.modules["sympy.core.random"]
    drawn["sympy_rng"] = sympy_random.rng.random()
    drawn["sympy_assumptions_rng"] = sympy_random._assumptions_rng.random()

torch.manual_seed(1234)
random.seed(1234)
numpy.random.seed(1234)
seeded = dict(torch_initial_seed=torch.initial_seed(), **draws())

main = sys.modules["__main__"]
loader = main.__dict__.get("__loader__")
frame = dict(
    annotations=annotations_at_start,
    stack_at_top=stack_at_top,
    stack_in_a_function=depth(),
    f_back_is_none=f_back_is_none,
    extract_stack=extracted,
    warned=warned,
    main_names=main_names,
    main_is_this_module=main.__dict__ is globals(),
    mp_main_is_main=sys.modules.get("__mp_main__") is main,
    name=__name__,
    file=__file__,
    cached=__cached__,
    spec=repr(__spec__),
    package=repr(__package__),
    loader=[type(loader).__name__, getattr(loader, "name", None), getattr(loader, "path", None)],
    builtins_is_module=__builtins__ is builtins,
    main_thread_native_id_is_pid=threading.main_thread().native_id == os.getpid(),
    main_thread_is_current=threading.main_thread() is threading.current_thread(),
    main_thread_ident=threading.main_thread().ident == threading.get_ident(),
)

path = os.path.join(out_dir, "r%d.a%d.json" % (rank, attempt))
with open(path + ".tmp", "w") as f:
    json.dump(
        dict(rank=rank, attempt=attempt, drawn=drawn, seeded=seeded, frame=frame, held=torch_held),
        f,
    )
os.rename(path + ".tmp", path)  # whole or absent, whenever the launcher stops this rank

# A script that wants more threads (too late here in any worker: torch is imported; a warm
# worker says so, once), and one that changes what torch's import does not read (nothing said).
os.environ["OMP_NUM_THREADS"] = "3"
os.environ["OMP_NUM_THREADS"] = "3"
os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + out_dir

if attempt == 0:
    world = int(os.environ["WORLD_SIZE"])
    if rank == 1:
        import time

        # Fail once every rank has written its record: the launcher stops the others then.
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            os.path.exists(os.path.join(out_dir, "r%d.a0.json" % r)) for r in range(world)
        ):
            time.sleep(0.02)
        if "--learned" in sys.argv:
            # rdrun's default: wait until its template learned torch (its remembered list in
            # this directory names it), so that attempt 1 is forked from a template holding it.
            import glob

            memory = sys.argv[sys.argv.index("--learned") + 1]
            while time.time() < deadline:
                names = []
                for p in glob.glob(os.path.join(memory, "*.json")):
                    try:
                        with open(p) as f:
                            names += json.load(f)["modules"]
                    except (OSError, ValueError, KeyError):
                        pass
                if "torch" in names:
                    break
                time.sleep(0.05)
        sys.exit(1)
    import time

    time.sleep(300)  # stopped by the launcher when rank 1 fails
    sys.exit(99)
