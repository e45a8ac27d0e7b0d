"""Celery canvas over tandem.infer, with a real Celery worker running the next steps:
link, link_error, chains, chords and groups."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from celery import chain, chord, group

from helpers import plain_celery, wait_until
from tandem.broker import keys, message
from tandem.broker.errors import BadInput
from tandem.stack import spawn

TESTS = Path(__file__).parent
SIM = keys.l1("sim:1")


@pytest.fixture
def followups(processes, settings, tmp_path, monkeypatch):
    """A plain Celery worker running tests/canvas_tasks.py."""
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    worker = spawn([], settings, tmp_path / "followups.log", module="canvas_tasks")
    processes.started.append(worker)
    app = plain_celery(settings)
    wait_until(lambda: app.control.ping(timeout=0.5), 60, "the follow-up worker")
    return app


def infer(app, inputs):
    kwargs = {"model": "sim:1", "inputs": inputs}
    return app.signature("tandem.infer", kwargs=kwargs, queue=SIM)


def step(app, name, *args, **kwargs):
    return app.signature(f"followups.{name}", args=args, kwargs=kwargs, queue="followups")


def test_link_chain_chord_and_group(processes, r, followups):
    app = followups
    processes.worker("w1")
    # A chain: tandem's output is the next task's first argument.
    result = chain(infer(app, [1, 2, 3]), step(app, "total")).apply_async()
    assert result.get(timeout=30) == 6
    assert result.parent.get(timeout=5) == [1, 2, 3]
    # link: a callback with the result.
    linked = infer(app, [4]).apply_async(link=step(app, "record", key="linked"))
    assert linked.get(timeout=30) == [4]
    wait_until(lambda: r.lrange("linked", 0, -1), 30, "the link callback")
    assert r.lrange("linked", 0, -1) == [b"[4]"]
    # A chord: the body runs once every header task is stored.
    body = chord([infer(app, [n, n]) for n in range(5)], step(app, "total")).apply_async()
    assert body.get(timeout=30) == 20
    # A group: each member gets its own result.
    members = group(infer(app, [n]) for n in range(4)).apply_async()
    assert members.get(timeout=30) == [[0], [1], [2], [3]]


def test_failures_reach_errbacks_and_the_chord(processes, r, followups):
    app = followups
    processes.worker("w1", models=("tiny:1",))

    def bad():  # tiny expects 8 numbers: BadInput
        return app.signature(
            "tandem.infer", kwargs={"model": "tiny:1", "inputs": [1]}, queue=keys.l1("tiny:1")
        )

    # An errback on another worker is called with the failed task's id, as in Celery.
    failed = bad().apply_async(link_error=step(app, "record", key="errors"))
    with pytest.raises(Exception, match="tiny expects a list of 8 numbers"):
        failed.get(timeout=30)
    wait_until(lambda: r.lrange("errors", 0, -1), 30, "the errback")
    assert r.lrange("errors", 0, -1) == [repr(failed.id).encode()]
    # The chain's later step is marked failed too, and never runs.
    broken = chain(bad(), step(app, "record", key="never")).apply_async()
    with pytest.raises(Exception, match="tiny expects"):
        broken.get(timeout=30)
    # A chord with a failed header task fails its body, with the header's error.
    good = app.signature(
        "tandem.infer", kwargs={"model": "tiny:1", "inputs": [0] * 8}, queue=keys.l1("tiny:1")
    )
    body = chord([good, bad()], step(app, "total")).apply_async()
    with pytest.raises(Exception, match="tiny expects"):
        body.get(timeout=30)
    assert r.llen("never") == 0


def test_a_hostile_next_step_fails_its_task_alone(processes, r, followups):
    processes.worker("w1")
    pushed = {}
    for name, sig in (("unpublishable", {"task": "followups.record", "args": 5}), ("junk", 7)):
        task_id, raw = message.encode("sim:1", [1], queue=SIM)
        envelope = json.loads(raw)
        body = json.loads(base64.b64decode(envelope["body"]))
        body[2]["callbacks"] = [sig]
        envelope["body"] = base64.b64encode(json.dumps(body).encode()).decode()
        r.lpush(SIM, json.dumps(envelope))
        pushed[name] = followups.AsyncResult(task_id)
    with pytest.raises(BadInput, match="next canvas step not published: TypeError"):
        pushed["unpublishable"].get(timeout=30)
    with pytest.raises(BadInput, match="malformed callbacks: expected a list of task signatures"):
        pushed["junk"].get(timeout=30)
    assert infer(followups, [2]).apply_async().get(timeout=30) == [2]  # still serving
