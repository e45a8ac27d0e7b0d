"""How the commands, and a Client, run in a folder find the Redis of a `tandem up` running
there."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from tandem.broker.settings import Settings, load_settings

#: Where `tandem up` writes its Redis URL and pid, relative to the folder it runs in.
STACK_FILE = Path(".tandem") / "stack.json"


def stack_url(stack_file: str | Path = STACK_FILE) -> str | None:
    """The Redis URL a running `tandem up` wrote to `stack_file`, or None if none is running."""
    try:
        stack = json.loads(Path(stack_file).read_text())
        url, pid = stack["url"], stack["pid"]
        if not isinstance(url, str) or not isinstance(pid, int) or pid <= 0:
            return None
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no file, a stale or foreign one: not a running stack
    return url


def redis_url(env: Mapping[str, str] | None = None) -> str:
    """The Redis URL tandem's commands use, for code of your own (a Celery app, say):
    TANDEM_REDIS_URL, else the Redis of a `tandem up` running in the current folder,
    else redis://localhost:6379/0."""
    return load_settings(env, fallback_url=stack_url).redis_url


def joined_settings(env: Mapping[str, str] | None = None, **flags) -> tuple[Settings, str]:
    """Settings for a process that joins a stack (its Redis from the redis_url flag, then
    TANDEM_REDIS_URL, then the `tandem up` running in the current folder, then localhost),
    and a note for when that Redis cannot be reached: how the default URL came to be
    chosen, or "" if something named the Redis."""
    looked: list[str | None] = []

    def from_stack() -> str | None:
        looked.append(stack_url(STACK_FILE))
        return looked[-1]

    settings = load_settings(env, fallback_url=from_stack, **flags)
    if looked != [None]:  # named by a flag or the environment, or a running stack's
        return settings, ""
    stale = " (its .tandem/stack.json is from one that stopped)" if STACK_FILE.exists() else ""
    return settings, (
        f"no `tandem up` runs in this folder{stale}, and neither --redis nor "
        f"TANDEM_REDIS_URL names a Redis, so this tried {settings.redis_url}"
    )
