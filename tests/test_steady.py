"""`tandem soak --faults none`: steady load, RSS and key counts, against a real stack."""

import os

from tandem.broker.settings import load_settings
from tandem.tools import steady


def test_rss_reads_this_process_and_its_children():
    assert steady.rss_kb(os.getpid()) > 0
    assert steady.rss_kb(2**22 + 7) == 0  # no such process: nothing, not an error


def test_key_kinds_hide_ids():
    assert steady.kind("celery-task-meta-abc") == "celery-task-meta-*"
    assert steady.kind("tandem:deliveries:ff00") == "tandem:deliveries:*"
    assert steady.kind("tandem:executor:w1:sim:1:0") == "tandem:executor:*"
    assert steady.kind("tandem:stats") == "tandem:stats"


def test_a_short_steady_run_answers_every_task_and_leaves_no_per_task_key():
    report = steady.run_steady(
        load_settings(env={}, loglevel="WARNING"), minutes=0.1, rate=40, ttl_s=3
    )
    assert report.submitted > 0 and report.answered == report.submitted
    assert report.unanswered == 0
    assert report.revoked > 0 and report.junk > 0
    assert max(s.sizes["dead_letters"] for s in report.samples) > 0  # junk was dead-lettered
    assert report.results_left == 0 and report.per_task_keys == 0
    assert not report.leaked
    for sample in report.samples:
        assert all(kb > 0 for kb in sample.rss_kb.values())
        assert set(sample.rss_kb) == {"coordinator", "worker 0", "worker 1", "redis"}
    assert any(line.startswith("keys before the load") for line in report.lines())
    # Redis's memory, by its own count, before the load and once the results expired.
    names = {"used_memory", "used_memory_lua", "used_memory_rss"}
    assert set(report.memory_before) == set(report.memory_after) == names
    assert all(kb > 0 for kb in (*report.memory_before.values(), *report.memory_after.values()))
