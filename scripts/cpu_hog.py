"""Run a command beside a CPU hog on every core: ``make test-loaded``'s load.

A time bound in the tests that holds only on an idle machine fails for a user whose machine is busy (and for CI).
This runs the command with one busy loop per core beside it (plain Python, so nothing to install), the way
``stress-ng --cpu N`` would, and ends the loops when the command ends, however it ends.

Usage: ``python scripts/cpu_hog.py [--hogs N] -- COMMAND ARG...`` (N: default, the machine's CPU count). Exits with
the command's status.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

_HOG = "while True: pass"


def _die_with_parent() -> None:
    # Linux: the hog gets SIGKILL when this script dies, even by SIGKILL, so no loop outlives the run.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy loops (default: CPU count)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    hogs = [subprocess.Popen([sys.executable, "-c", _HOG], preexec_fn=_die_with_parent)
            for _ in range(args.hogs)]
    print(f"cpu_hog: {args.hogs} busy loop(s) beside: {' '.join(command)}", flush=True)
    t0 = time.monotonic()
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
        print(f"cpu_hog: {args.hogs} busy loop(s) ended after {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
