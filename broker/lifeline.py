"""How a process sees that the process which started it is gone.

`tandem up` holds the write end of a pipe; each process it starts inherits the read end
(its `lifeline_fd` setting). Nothing is ever written to it. When the parent exits,
however it exits (SIGKILL included), the kernel closes its end, and a read in the child
returns end of file at once: the child then stops as on SIGTERM (a worker finishes its
batch, hands back what it holds and deregisters). Nothing is polled.

The same holds for a group: a pipe whose write end several processes hold reads end of
file once the last of them has exited (shell/keeper.py stops Redis that way).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from tandem.broker.errors import BadSetting

log = logging.getLogger("tandem.lifeline")


def terminate_self() -> None:
    """SIGTERM to this process: the same warm stop as an operator's."""
    os.kill(os.getpid(), signal.SIGTERM)


def watch(fd: int, on_gone: Callable[[], None] = terminate_self) -> threading.Thread:
    """Call on_gone() once fd, a pipe's read end, reads end of file: every holder of the
    write end has exited. Raises BadSetting if fd is not open."""
    try:
        os.fstat(fd)
    except OSError as e:
        raise BadSetting(f"lifeline_fd {fd} is not an open file descriptor: {e}") from None

    def wait() -> None:
        try:
            while os.read(fd, 64):
                pass  # nothing is written; a stray byte changes nothing
        except OSError:
            pass  # closed under us: the same as end of file
        log.warning("lifeline closed: the process that started this one is gone; stopping")
        on_gone()

    thread = threading.Thread(target=wait, name="tandem lifeline", daemon=True)
    thread.start()
    return thread


class Pipe:
    """A parent's side of a lifeline: pass `read_fd` to children (subprocess's
    pass_fds), and keep `write_fd` open for as long as they should live."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def close(self) -> None:
        """Close both ends, once (a number closed twice may be another file's by then)."""
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1
