"""The peer benchmark (python/examples/tp_mlp_bench.py) on a small MLP:
every mode, torch over gloo and mpi4py included, gives the float64
reference's results, and the JSON has one row per mode."""

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import tp_mlp_bench  # noqa: E402


def test_every_mode_checks(comm):
    path = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    out = os.path.join(path, "tp_mlp.json")
    status = tp_mlp_bench.main(["--seq", "24", "--hidden", "12", "--warmup", "1", "--steps", "2", "--json", out])
    rows = comm.bcast([json.loads(line) for line in open(out)] if comm.rank == 0 else None)
    assert status == 0
    assert [r["mode"] for r in rows] == tp_mlp_bench.MODES
    for r in rows:
        assert r["max_rel_err"] <= 1e-3 and r["step_ms"] > 0 and r["ranks"] == comm.size
