"""An executor's state, as the executor table stores it (docs/design.md, "States")."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover
    from enum import Enum

    class StrEnum(str, Enum):
        pass


class State(StrEnum):
    IDLE = "IDLE"  # L2 open; nothing held
    WAITING = "WAITING"  # L2 open; a batch fills until full or max_wait_ms
    WORKING = "WORKING"  # computing; L2 closed
    STOPPING = "STOPPING"  # finishing the batch in hand; L2 closed
