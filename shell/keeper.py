"""Runs a command until a group of processes is gone: `tandem up` runs its redis-server
under it, so that Redis outlives every other process of the stack, and then stops.

    python -m tandem.keeper FD -- COMMAND [ARG ...]

FD is the read end of a pipe whose write end `up`, its coordinator and its workers
hold (broker/lifeline.py). Once the last of them has exited, however it exited, the
pipe reads end of file and the keeper stops COMMAND with SIGTERM (Redis then writes its
AOF and exits). SIGTERM or SIGINT to the keeper stops it the same way. The keeper exits
with COMMAND's exit code.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from tandem.broker.lifeline import watch


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m tandem.keeper FD -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    fd = int(argv[0])
    child = subprocess.Popen(argv[2:])  # its output goes where the keeper's does

    def stop(*_: object) -> None:
        if child.poll() is None:
            child.terminate()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    watch(fd, on_gone=stop)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
