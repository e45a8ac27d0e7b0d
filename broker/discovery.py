"""How the commands, and a Client, run in a folder find the Redis of a `tandem up` running
there."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from tandem.broker.settings import load_settings

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
