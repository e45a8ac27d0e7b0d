"""tools/whereabouts.py: a fault run's report says where a task without a result is."""

from __future__ import annotations

import json

from tandem.broker import deadletter, keys, message
from tandem.tools import whereabouts

MODEL = "sim:1"


def queued(task_id: str) -> bytes:
    return message.encode(MODEL, [1], queue=keys.l1(MODEL), task_id=task_id)[1].encode()


def test_every_place_a_task_can_sit_is_named(r, tmp_path):
    ids = [f"task-{n}" for n in range(7)]
    r.sadd(keys.executors(MODEL), "w1:sim:1")
    r.lpush(keys.l1_keys(MODEL)[2], queued(ids[0]))
    r.lpush(keys.retry(MODEL), queued(ids[1]))
    r.lpush(keys.l2("w1:sim:1"), queued(ids[2]))
    r.lpush(keys.inflight("w1:sim:1"), queued(ids[3]), queued(ids[4]))
    r.set(keys.result(ids[4]), json.dumps({"status": "SUCCESS", "result": [1]}))
    r.lpush(keys.DEAD, deadletter.record(queued(ids[5]), "PoisonMessage: x", task_id=ids[5]))
    log = tmp_path / "worker.log"
    log.write_text(f"a line\nreclaimed {ids[3]} from w1\nanother\n")

    found = whereabouts.places(r, MODEL, ids)

    assert found == {
        ids[0]: [f"L1 {keys.l1_keys(MODEL)[2]}"],
        ids[1]: ["retry"],
        ids[2]: ["L2 of w1:sim:1"],
        ids[3]: ["in flight at w1:sim:1"],
        ids[4]: ["result SUCCESS", "in flight at w1:sim:1"],
        ids[5]: ["dead letter: PoisonMessage: x"],
        ids[6]: [],
    }
    lines = whereabouts.describe(r, MODEL, ids[3:4] + ids[6:], [log, tmp_path / "absent.log"])
    assert lines == [
        f"{ids[3]}: in flight at w1:sim:1",
        f"    worker.log: reclaimed {ids[3]} from w1",
        f"{ids[6]}: nowhere in Redis",
    ]


def test_a_result_that_is_not_json_is_still_named(r):
    r.set(keys.result("t"), b"\xff\x00")
    assert whereabouts.places(r, MODEL, ["t"]) == {"t": ["result (not JSON)"]}
    assert whereabouts.places(r, MODEL, []) == {}
