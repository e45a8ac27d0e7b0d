"""Fault injection for tests: make a named Table step fail, once, at its Nth call.

Set TANDEM_TEST_FAULTS in a worker's environment to a comma-separated list of
``STEP:WHEN:NTH[:KIND]``:

- STEP: an executor step in Table: a script (register, claim_or_idle, claim, begin,
  state, complete, reclaim) or wait_l2 (the BLMOVE on L2) or window (the wait on the
  full channel; "after" is any wait that ended); route, a producer's route call, is
  only noted (below).
- WHEN: ``before`` the call reaches Redis, or ``after`` it ran there and did something
  (a non-empty reply, then lost): the step that strands work if it is mishandled.
- NTH: the call that fails, counting from 1 (``after``: only calls that did something);
  ``*`` fails every one.
- KIND: ``redis`` (a ConnectionError, the default) or ``crash`` (a RuntimeError, as a
  bug would raise).

Unset, it costs one flag per step. Never set it in production.

TANDEM_TEST_TRACE, a folder, has each step noted as it passes (CLOCK_MONOTONIC ns, step,
when), in the folder's <pid>.steps, written out when an executor is about to wait on L2
(off a task's path): `tandem bench --profile latency` times each hop with it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import redis

from tandem.broker.errors import BadSetting

ENV = "TANDEM_TEST_FAULTS"
TRACE_ENV = "TANDEM_TEST_TRACE"
log = logging.getLogger("tandem.faults")


class Faults:
    def __init__(self, spec: str = "", trace: str | None = None) -> None:
        self.rules: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        #: The folder each step is noted in (TRACE_ENV), or None.
        self.trace = None if trace is None else Path(trace)
        self._noted: list[str] = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            fields = part.split(":")
            if len(fields) not in (3, 4) or fields[1] not in ("before", "after"):
                raise BadSetting(f"{ENV}: {part!r} is not STEP:before|after:NTH[:redis|crash]")
            kind = fields[3] if len(fields) == 4 else "redis"
            if kind not in ("redis", "crash") or not (fields[2] == "*" or fields[2].isdigit()):
                raise BadSetting(f"{ENV}: {part!r} is not STEP:before|after:NTH[:redis|crash]")
            self.rules.setdefault((fields[0], fields[1]), []).append((fields[2], kind))
        #: Some step has a fault due or is noted: at() has something to do. Steps on a
        #: task's path skip the call otherwise (a call costs more cold than a flag).
        self.active = bool(self.rules) or self.trace is not None

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get(ENV, ""), os.environ.get(TRACE_ENV) or None)

    def at(self, step: str, when: str, reply: object = True) -> None:
        """Raise the injected fault if one is due at this step (after: given its reply)."""
        if self.trace is not None and (reply or when == "before"):
            self._note(step, when)
        rules = self.rules.get((step, when))
        if not rules or not reply:
            return
        with self._lock:
            n = self.calls[step, when] = self.calls.get((step, when), 0) + 1
        for nth, kind in rules:
            if nth == "*" or int(nth) == n:
                text = f"injected fault at {step}:{when}:{n}"
                log.warning("%s", text)
                if kind == "crash":
                    raise RuntimeError(text)
                raise redis.ConnectionError(text)

    def _note(self, step: str, when: str) -> None:
        with self._lock:  # steps pass on several threads (executor, returner)
            self._noted.append(step_line(time.monotonic_ns(), step, when))
            full = len(self._noted) >= 1000
        if full or (step, when) == ("wait_l2", "before"):
            self.flush()

    def flush(self) -> None:
        """Write out the steps noted so far (TRACE_ENV)."""
        with self._lock:
            noted, self._noted = self._noted, []
        if noted and self.trace is not None:
            write_steps(self.trace, noted)


def step_line(at_ns: int, step: str, when: str) -> str:
    """One noted step, as a steps file holds it."""
    return f"{at_ns} {step} {when}\n"


def write_steps(folder: Path, lines: list[str]) -> None:
    """Append noted steps (step_line) to this process's steps file in folder."""
    with open(folder / f"{os.getpid()}.steps", "a") as out:
        out.writelines(lines)
