"""The benchmark harness itself, on a tiny sweep. It asserts consistency, never speed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

COLUMNS = {
    "system",
    "offered_rps",
    "achieved_rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_batch",
    "lost",
    "failed",
}


def test_a_tiny_sweep_writes_consistent_json_and_a_png(tmp_path):
    pytest.importorskip("celery_batches")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    done = subprocess.run(
        [
            "tandem",
            "bench",
            "--rates",
            "20",
            "--seconds",
            "1",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--systems",
            "tandem,celery-plain,celery-batches/10ms",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    assert [r["system"] for r in rows] == ["tandem", "celery-plain", "celery-batches/10ms", "limit"]
    for row in rows:
        assert set(row) >= COLUMNS
    for row in rows[:-1]:
        assert row["lost"] == 0 and row["failed"] == 0
        assert 0 < row["achieved_rps"] <= row["offered_rps"] * 2 + 5  # Poisson noise over 1 s
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
        assert row["mean_batch"] >= 1
    limit = rows[-1]
    assert limit["p50_ms"] == 20.5  # the sim model's cost of one item
    assert limit["achieved_rps"] == pytest.approx(2 * 32 / 36 * 1000, rel=1e-3)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "floor = compute of 1 item" in done.stdout
