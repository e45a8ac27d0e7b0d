"""Messages from every client's protocol: Celery's protocol 1 and hybrids, gocelery,
celery-node. Each is converted as Celery's worker converts it and gets its own result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from protocols import celery_node_v1, celery_node_v2, gocelery

from helpers import plain_celery
from tandem.broker import keys, message
from tandem.broker.errors import BadInput, DeadlineExceeded

QUEUE = keys.l1("sim:1")
TESTS = Path(__file__).parent
CELERY_NODE = "0.5.9"
BUILDERS = [gocelery, celery_node_v1, celery_node_v2]


def decode(raw: bytes) -> message.Task:
    return message.decode(raw, max_bytes=1 << 20)


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([], {"model": "sim:1", "inputs": [1, 2]}),
        (["sim:1", [1, 2]], {}),
        (["sim:1"], {"inputs": [1, 2]}),
    ],
)
def test_each_clients_message_decodes_to_the_same_task(build, args, kwargs):
    task_id = str(uuid.uuid4())
    task = decode(build(task_id, args, kwargs, QUEUE))
    assert task.error is None, task.error
    assert (task.id, task.model, task.inputs) == (task_id, "sim:1", [1, 2])


def test_a_go_expiry_with_nanoseconds_is_honoured():
    past = (datetime.now(timezone.utc) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")
    raw = gocelery("t1", [], {"model": "sim:1", "inputs": 1}, QUEUE, expires=past + ".123456789Z")
    task = decode(raw)
    task.check_deadline(datetime.now(timezone.utc))
    assert isinstance(task.error, DeadlineExceeded)


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        (["sim:1", [1], 3], {}, "got 3 positional arguments"),
        (["sim:1"], {"model": "sim:1", "inputs": 1}, "multiple values for argument 'model'"),
        ([], {"model": "sim:1"}, "missing inputs"),
        ([], [], "keyword arguments must be a mapping"),
    ],
)
def test_bad_protocol_1_bodies_keep_their_id_and_say_why(args, kwargs, error):
    task = decode(gocelery("t2", args, kwargs, QUEUE))
    assert task.id == "t2"
    assert isinstance(task.error, BadInput) and error in str(task.error)


def test_a_protocol_1_body_without_an_id_has_none():
    raw = json.loads(celery_node_v1("x", [], {"model": "sim:1", "inputs": 1}, QUEUE))
    body = {"task": "tandem.infer", "args": [], "kwargs": {}}
    raw["body"] = __import__("base64").b64encode(json.dumps(body).encode()).decode()
    task = decode(json.dumps(raw).encode())
    assert task.id is None and isinstance(task.error, BadInput)


def test_every_protocol_gets_its_own_result_from_a_real_worker(processes, r, settings):
    processes.worker("w1")
    pushed = {}
    for n, build in enumerate(BUILDERS):
        task_id = str(uuid.uuid4())
        r.lpush(QUEUE, build(task_id, ["sim:1"], {"inputs": [n]}, QUEUE))
        pushed[task_id] = [n]
    # A Celery app that still speaks protocol 1 (task_protocol = 1).
    app = plain_celery(settings)
    app.conf.task_protocol = 1
    old = app.send_task("tandem.infer", kwargs={"model": "sim:1", "inputs": [9]}, queue=QUEUE)
    pushed[old.id] = [9]
    app.conf.task_protocol = 2
    hybrid = app.send_task("tandem.infer", args=["sim:1", [8]], queue=QUEUE)
    pushed[hybrid.id] = [8]
    for task_id, inputs in pushed.items():
        assert app.AsyncResult(task_id).get(timeout=30) == inputs
    assert r.llen(keys.DEAD) == 0


@pytest.fixture(scope="module")
def celery_node(tmp_path_factory):
    """celery-node installed from the npm registry, or a skip that says why not."""
    npm = shutil.which("npm")
    if not shutil.which("node") or not npm:
        pytest.skip("node and npm are not installed: the real celery-node test is skipped")
    folder = tmp_path_factory.mktemp("celery-node")
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", f"celery-node@{CELERY_NODE}"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"npm could not install celery-node: {done.stderr.strip()[-300:]}")
    return folder


@pytest.mark.parametrize("protocol", [1, 2])
def test_a_real_celery_node_client_gets_its_result(processes, settings, celery_node, protocol):
    processes.worker("w1")
    done = subprocess.run(
        ["node", str(TESTS / "celery_node_client.js"), settings.redis_url, str(protocol)]
        + [QUEUE, "sim:1", json.dumps([protocol, "js"])],
        cwd=celery_node,
        env={**os.environ, "NODE_PATH": str(celery_node / "node_modules")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [protocol, "js"]
