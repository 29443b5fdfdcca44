"""The example's loss parity with single-process PyTorch over a few steps,
bulk and overlapped (python/examples/train_gpt.py --check), and with the
ranks as data-parallel replicas of tensor groups, their gradients averaged
after the backward or during it."""

import json
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import train_gpt  # noqa: E402


def test_loss_parity(comm):
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    out = os.path.join(path, "train.json")
    status = train_gpt.main(["--steps", "3", "--check", "--layers", "2", "--hidden", "64", "--heads", "4",
                             "--seq", "24", "--batch", "2", "--strategy", "bulk", "ring", "--json", out])
    rows = [json.loads(line) for line in open(out)] if comm.rank == 0 else None
    rows = comm.bcast(rows)
    assert status == 0
    assert [r["strategy"] for r in rows] == ["bulk", "ring"]
    for r in rows:
        assert r["max_rel_loss_diff"] <= 2e-3 and r["step_ms"] > 0
        assert abs(r["final_loss"] - r["reference_losses"][-1]) <= 2e-3 * r["reference_losses"][-1]


def test_data_parallel_loss_parity(comm):
    """tp 2 x dp 2 at 4 ranks, else tp 1 x dp size: the replicas' averaged
    gradients train the single-process model on all their sequences; without
    the average (none) the losses leave it."""
    if comm.size == 1:
        return  # no replicas: test_loss_parity covers one tensor group
    tp = 2 if comm.size == 4 else 1
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    out = os.path.join(path, "train.json")
    status = train_gpt.main(["--steps", "3", "--check", "--layers", "2", "--hidden", "64", "--heads", "4",
                             "--seq", "24", "--batch", "2", "--strategy", "ring", "--tp", str(tp), "--dp-sync",
                             "after", "overlapped", "none", "--bucket-mb", "0.01", "--json", out])
    rows = [json.loads(line) for line in open(out)] if comm.rank == 0 else None
    rows = comm.bcast(rows)
    assert status == 0
    assert [(r["dp_sync"], r["tp"], r["dp"]) for r in rows] == [(s, tp, comm.size // tp)
                                                                for s in ("after", "overlapped", "none")]
    ref = rows[0]["reference_losses"]
    for r in rows:
        assert r["losses"][0] == pytest.approx(ref[0], rel=2e-3)  # the same weights before the first step
        if r["dp_sync"] != "none":
            assert max(abs(x - y) / y for x, y in zip(r["losses"], ref)) <= 2e-3
    assert abs(rows[2]["final_loss"] - ref[-1]) > 1e-4 * ref[-1]
