"""The MoE example's loss parity with single-process PyTorch over a few
steps, bulk and pairwise (python/examples/train_moe.py --check)."""

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import train_moe  # noqa: E402


def test_loss_parity(comm):
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    out = os.path.join(path, "train.json")
    status = train_moe.main(["--steps", "4", "--check", "--width", "32", "--ffn", "48", "--tokens", "40",
                             "--experts-per-rank", "2", "--topk", "2", "--strategy", "bulk", "pairwise",
                             "--json", out])
    rows = [json.loads(line) for line in open(out)] if comm.rank == 0 else None
    rows = comm.bcast(rows)
    assert status == 0
    assert [r["strategy"] for r in rows] == ["bulk", "pairwise"]
    for r in rows:
        assert r["max_rel_loss_diff"] <= 2e-3 and r["step_ms"] > 0
        assert len(r["losses"]) == 4 and r["experts"] == 2 * comm.size
        assert abs(r["final_loss"] - r["reference_losses"][-1]) <= 2e-3 * r["reference_losses"][-1]
