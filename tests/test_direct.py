"""broker/direct.py: connections of its own for the low-load path's round trips, against
a real Redis: replies and errors as the client gives them, one connection per call at a
time, and any other error drops the connection and goes through the client."""

from __future__ import annotations

import threading

import pytest
import redis
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from helpers import wait_until
from tandem.broker.direct import PING, DirectCalls

SCRIPT = (
    "if ARGV[1] == 'fail' then return redis.error_reply('BAD no') end return {KEYS[1], ARGV[1]}"
)


def client_ids(r) -> set[int]:
    return {int(c["id"]) for c in r.client_list()}


def blocked_clients(r) -> int:
    return int(r.info("clients")["blocked_clients"])


def test_a_call_at_a_time_shares_one_connection_and_calls_at_once_do_not(r):
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    assert direct.script(script, ["k"], ["v"]) == script(keys=["k"], args=["v"]) == [b"k", b"v"]
    mine = direct.command("CLIENT", "ID")
    seen = []
    for _ in range(3):  # one thread after another: the same connection again
        thread = threading.Thread(target=lambda: seen.append(direct.command("CLIENT", "ID")))
        thread.start()
        thread.join()
    assert seen == [mine] * 3
    # A call still waiting on its reply holds its connection: another gets its own.
    blocked = threading.Thread(
        target=lambda: direct.command("BLMOVE", "q", "p", "RIGHT", "LEFT", 10)
    )
    blocked.start()
    wait_until(lambda: blocked_clients(r) == 1, 10, "the BLMOVE waiting")
    assert direct.command("CLIENT", "ID") != mine
    r.lpush("q", b"x")
    blocked.join()
    direct.close()


def test_the_commands_own_error_is_raised_and_the_connection_kept(r):
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    before = direct.command("CLIENT", "ID")
    with pytest.raises(redis.ResponseError, match="BAD no"):
        direct.script(script, ["k"], ["fail"])
    assert direct.command("CLIENT", "ID") == before
    direct.close()


def test_a_command_sent_after_the_script_comes_back_second_in_step(r):
    """`then` (a WAIT for replicas, in the executor's claims): in the same write, its reply
    second; after the script's own error, the connection is still in step."""
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    assert direct.script(script, ["k"], ["v"], then=("ECHO", "then")) == ([b"k", b"v"], b"then")
    with pytest.raises(redis.ResponseError, match="BAD no"):
        direct.script(script, ["k"], ["fail"], then=("ECHO", "left"))
    assert direct.command("ECHO", "mine") == b"mine"  # not the reply left over
    for once in (True, False):  # NOSCRIPT: loaded and run once here, or through the client
        r.script_flush()
        reply = direct.script(script, ["k"], [f"{once}"], then=("ECHO", "x"), once=once)
        assert reply == ([b"k", f"{once}".encode()], b"x")
    direct.close()


def test_a_flushed_script_is_loaded_again(r):
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    assert direct.script(script, ["k"], ["v"]) == [b"k", b"v"]
    r.script_flush()
    assert direct.script(script, ["k"], ["again"]) == [b"k", b"again"]
    direct.close()


def test_a_killed_connection_is_replaced_and_the_call_still_answered(r):
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    killed = direct.command("CLIENT", "ID")
    r.client_kill_filter(_id=killed)
    assert direct.script(script, ["k"], ["after"]) == [b"k", b"after"]  # through the client
    assert direct.command("CLIENT", "ID") != killed  # a new connection of its own
    direct.close()


def test_a_call_asked_to_run_once_raises_a_cut_connection_instead_of_sending_again(r):
    """What the returner's count.lua needs: the client's retries would run it again."""
    direct = DirectCalls(r)
    script = r.register_script("return redis.call('INCR', KEYS[1])")
    assert direct.script(script, ["runs"], [], once=True) == 1
    r.client_kill_filter(_id=direct.command("CLIENT", "ID"))
    with pytest.raises(redis.ConnectionError):
        direct.script(script, ["runs"], [], once=True)
    assert r.get("runs") == b"1"  # not sent through the client
    assert direct.script(script, ["runs"], [], once=True) == 2  # a new connection next
    r.script_flush()
    assert direct.script(script, ["runs"], [], once=True) == 3  # loaded, then run once
    direct.close()


def test_a_read_cut_short_never_leaves_its_reply_for_the_next_call(redis_server, r):
    """BLMOVE outlasts the socket timeout: the read is cut short with its reply still due.
    The next call must get its own reply, not that one."""
    client = redis.Redis.from_url(redis_server.url, socket_timeout=0.2)
    direct = DirectCalls(client)
    with pytest.raises(redis.TimeoutError):
        direct.command("BLMOVE", "empty", "elsewhere", "RIGHT", "LEFT", 0.5)
    r.lpush("empty", b"late")  # what the cut BLMOVE would have returned
    assert direct.command("ECHO", "mine") == b"mine"
    direct.close()
    client.close()


def test_close_closes_every_connection_made(r):
    direct = DirectCalls(r)
    blocked = threading.Thread(
        target=lambda: direct.command("BLMOVE", "q", "p", "RIGHT", "LEFT", 10)
    )
    blocked.start()
    wait_until(lambda: blocked_clients(r) == 1, 10, "the BLMOVE waiting")
    made = {direct.command("CLIENT", "ID")}  # a second connection: the first is waiting
    r.lpush("q", b"x")
    blocked.join()
    made |= {direct.command("CLIENT", "ID") for _ in range(2)}  # both, given back
    assert len(made) == 2 and made <= client_ids(r)
    direct.close()
    wait_until(lambda: not made & client_ids(r), 10, "close() closed both")


def ping_calls(r) -> int:
    return int(r.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))


def test_a_script_that_publishes_goes_after_a_ping_on_the_same_connection(r):
    """publishes: one PING just before the script, on its connection; the reply, the
    errors and the reload after a flush are the script's, as without it; the subscriber
    gets what it publishes."""
    assert r.connection_pool.connection_class().pack_command("PING") == [PING]
    direct = DirectCalls(r)
    script = r.register_script(
        "if ARGV[1] == 'fail' then return redis.error_reply('BAD no') end "
        "redis.call('PUBLISH', KEYS[1], ARGV[1]) return ARGV[1]"
    )
    pubsub = r.pubsub()
    pubsub.subscribe("heard")
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    r.script_load(script.script)
    mine = direct.command("CLIENT", "ID")
    pings = ping_calls(r)
    assert direct.script(script, ["heard"], ["one"], publishes=True) == b"one"
    assert ping_calls(r) == pings + 1
    assert direct.command("CLIENT", "ID") == mine
    assert pubsub.get_message(timeout=5)["data"] == b"one"
    with pytest.raises(redis.ResponseError, match="BAD no"):
        direct.script(script, ["heard"], ["fail"], publishes=True)
    assert direct.command("CLIENT", "ID") == mine  # its own error: the connection kept
    r.script_flush()
    assert direct.script(script, ["heard"], ["two"], publishes=True) == b"two"  # loaded again
    assert pubsub.get_message(timeout=5)["data"] == b"two"
    pubsub.close()
    direct.close()


ARG = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(),
    st.floats(allow_nan=False),
    st.binary(min_size=6001, max_size=7000),  # past redis-py's buffer cutoff: a chunk of its own
)
#: Arguments after the kept ones may also be of types that _pack leaves to redis-py.
TAIL = ARG | st.binary(max_size=40).map(bytearray) | st.binary(max_size=40).map(memoryview)


@given(
    args=st.lists(ARG, min_size=1, max_size=12),
    tail=st.lists(TAIL, max_size=4),
    lead=st.integers(min_value=1, max_value=12),
    first=st.sampled_from(["EVALSHA", "SET key", b"ECHO"]),
)
@hypothesis_settings(max_examples=300, deadline=None)
def test_arguments_packed_once_make_the_bytes_pack_command_makes(args, tail, lead, first):
    """Any arguments, any number of them kept packed: the very bytes redis-py sends, and
    the same again from the kept packing."""
    r = redis.Redis()  # packs without connecting
    direct = DirectCalls(r)
    connection = r.connection_pool.connection_class(**r.connection_pool.connection_kwargs)
    call = (first, *args, *tail)
    lead = min(lead, 1 + len(args))
    expected = b"".join(connection.pack_command(*call))
    assert b"".join(direct._pack(connection, call, lead)) == expected
    assert b"".join(direct._pack(connection, call, lead)) == expected  # from what it kept


def test_equal_numbers_of_other_types_are_kept_apart():
    r = redis.Redis()
    direct = DirectCalls(r)
    connection = r.connection_pool.connection_class(**r.connection_pool.connection_kwargs)
    for call in (("EVALSHA", 1, "x"), ("EVALSHA", 1.0, "x")):
        expected = b"".join(connection.pack_command(*call))
        assert b"".join(direct._pack(connection, call, 2)) == expected


def test_a_script_with_its_leading_arguments_kept_answers_as_the_client_does(r):
    direct = DirectCalls(r)
    script = r.register_script(SCRIPT)
    for value in ("a", "b b", "c"):
        assert direct.script(script, ["k"], [value], same=1) == [b"k", value.encode()]
    assert len(direct._heads) == 1
    direct.close()
