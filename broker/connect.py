"""Redis clients from a URL: a plain one (redis://, rediss://, unix://), or the current
primary behind Redis Sentinel, in kombu's form, which Celery and Flower read too:

    sentinel://[:PASSWORD@]HOST:PORT[/DB][?TLS][;sentinel://HOST:PORT ...]

with the master's name in the setting sentinel_master (TANDEM_SENTINEL_MASTER). TLS, as
kombu reads it, is the query of the first part, with the keys a rediss:// URL takes:
ssl_cert_reqs (required, optional or none), ssl_ca_certs, ssl_certfile, ssl_keyfile; it
is then used to the sentinels and to the primary alike. A Sentinel
client asks the sentinels for the primary on each new connection, so after a failover
every process reconnects to the new one (a connection to a demoted primary fails as a
ConnectionError, which every caller already retries)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

import redis
from redis.sentinel import Sentinel

from tandem.broker.errors import BadSetting

SCHEME = "sentinel://"
#: The TLS keys a sentinel:// URL's query may hold, as for rediss://.
TLS_KEYS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
CERT_REQS = ("required", "optional", "none")
#: The protocol tandem's own connections speak (see connect()).
RESP = 2


def is_sentinel(url: str) -> bool:
    return url.startswith(SCHEME)


def sentinel_parts(url: str) -> tuple[list[tuple[str, int]], str | None, int]:
    """The sentinels' addresses, the password and the database of a sentinel:// URL."""
    hosts, password, db = [], None, 0
    for part in filter(None, url.split(";")):
        if not part.startswith(SCHEME):
            raise BadSetting(f"{part!r} in a Sentinel URL is not {SCHEME}HOST:PORT")
        split = urlsplit(part)
        try:
            hosts.append((split.hostname or "localhost", split.port or 26379))
            if split.path.strip("/"):
                db = int(split.path.strip("/"))
        except ValueError as e:
            raise BadSetting(f"{part!r}: {e}") from None
        password = split.password or password
    if not hosts:
        raise BadSetting(f"{url!r} names no sentinel")
    return hosts, password, db


def sentinel_tls(url: str) -> dict[str, str]:
    """The TLS options of a sentinel:// URL (the query of its first part); {} for none."""
    first = url.split(";", 1)[0]
    found = dict(parse_qsl(urlsplit(first).query, keep_blank_values=True))
    unknown = sorted(set(found) - set(TLS_KEYS))
    if unknown:
        raise BadSetting(f"{unknown[0]!r} in a Sentinel URL: it takes {', '.join(TLS_KEYS)}")
    reqs = found.get("ssl_cert_reqs")
    if reqs is not None and reqs not in CERT_REQS:
        raise BadSetting(f"ssl_cert_reqs={reqs!r} in a Sentinel URL: one of {CERT_REQS}")
    if any(urlsplit(part).query for part in url.split(";")[1:]):
        raise BadSetting("TLS options go on the first sentinel:// part of the URL, as kombu reads")
    return found


def connect(url: str, master: str = "", **options: Any) -> redis.Redis:
    """A client of the Redis at `url`; of the current primary if it is a Sentinel URL.
    It speaks RESP2 unless the URL or the options say otherwise (redis-py 8 defaults to
    RESP3): on RESP3 each published result comes as a push frame, which redis-py hands
    through a logger on its way, and the result listener reads its subscription directly
    only on RESP2. Replies reach callers in the same shapes on either."""
    options.setdefault("protocol", RESP)
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    return _primary(Sentinel, url, master, options)


def connect_async(url: str, master: str = "", **options: Any):
    """connect(), for asyncio: a redis.asyncio client, RESP2 as connect()'s."""
    from redis import asyncio as aioredis
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    options.setdefault("protocol", RESP)

    if not is_sentinel(url):
        return aioredis.Redis.from_url(url, **options)
    return _primary(AsyncSentinel, url, master, options)


def _primary(sentinel_class, url: str, master: str, options: dict[str, Any]):
    hosts, password, db = sentinel_parts(url)
    if not master:
        raise BadSetting("a sentinel:// URL needs the master's name: TANDEM_SENTINEL_MASTER")
    tls = _tls_options(url)
    timeout = options.get("socket_timeout") or 5.0
    sentinels = sentinel_class(
        hosts,
        socket_timeout=timeout,
        sentinel_kwargs={"password": password, "socket_timeout": timeout, **tls},
    )
    return sentinels.master_for(master, password=password, db=db, **tls, **options)


def _tls_options(url: str) -> dict[str, Any]:
    """redis-py's connection options for the URL's TLS; {} for none."""
    tls = sentinel_tls(url)
    return {"ssl": True, **tls} if tls else {}


def celery_options(url: str, master: str) -> dict[str, Any]:
    """The Celery settings that point broker and result backend at the same Redis."""
    if not is_sentinel(url):
        return {}
    transport: dict[str, Any] = {"master_name": master}
    options: dict[str, Any] = {
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
    }
    tls = sentinel_tls(url)
    if tls:  # to the sentinels (sentinel_kwargs) and to the primary, for each client
        transport["sentinel_kwargs"] = _tls_options(url)
        options["broker_use_ssl"] = tls  # kombu reads the query too; Flower reads only this
        options["redis_backend_use_ssl"] = tls
    return options
