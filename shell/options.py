"""What the `tandem` commands share: the Redis option, the settings a command joins a
stack with, logging, and the one-line failure."""

from __future__ import annotations

import logging
import sys

import click

from tandem.broker.discovery import joined_settings
from tandem.broker.settings import Settings

#: The defaults, as every --help text states them.
DEFAULTS = Settings()


#: Set when a command took the default Redis URL: nothing named one and no `tandem up`
#: runs in this folder. A Redis that cannot be reached is then explained.
_DEFAULT_URL_NOTE: list[str] = []


def joined(**flags):
    """Settings for a command that joins a stack: --redis, TANDEM_REDIS_URL, else the
    Redis of a `tandem up` running in this folder (its .tandem/stack.json), else localhost."""
    settings, note = joined_settings(**flags)
    _DEFAULT_URL_NOTE[:] = [note] if note else []
    return settings


def redis_option(f):
    return click.option(
        "--redis",
        "redis_url",
        default=None,
        help="Redis URL (redis://, rediss://, with user:pass@ for ACLs); else TANDEM_REDIS_URL.",
    )(f)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def fail(text: str) -> None:
    """One line on stderr, exit 1: a command's own failure."""
    click.echo(f"error: {text}", err=True)
    sys.exit(1)


def default_url_note(error: Exception | None = None) -> str:
    from tandem.broker.errors import BrokerUnavailable

    if _DEFAULT_URL_NOTE and (error is None or isinstance(error, BrokerUnavailable)):
        return f"; {_DEFAULT_URL_NOTE[0]}"
    return ""
