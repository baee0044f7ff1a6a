"""Writes bursts of lines on stdout and stderr as fast as it can, after `import torch`: line i of
rank R is `oR-i-` (stdout) or `eR-i-` (stderr) padded with `x` to a length that cycles through
short lines, lines over the 4 KiB atomic-pipe-write size and lines over a 64 KiB pipe buffer."""
import os
import sys

import torch  # noqa: F401  (what a real job imports first; under warm start the template did)

LINES = int(sys.argv[sys.argv.index("--lines") + 1])
rank = int(os.environ["RANK"])
LENGTHS = (10, 200, 5000, 70000, 1, 4095, 4097)


def line(kind: str, i: int) -> str:
    head = f"{kind}{rank}-{i}-"
    return head + "x" * max(0, LENGTHS[i % len(LENGTHS)] - len(head))


for i in range(LINES):
    # print() under -u writes the text and the newline separately: rdrun must join them.
    print(line("o", i))
    if i % 3 == 0:
        print(line("e", i), file=sys.stderr)
