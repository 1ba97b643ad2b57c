"""The prepared GPU run (issue #51) runs end to end on the CPU (``GPU_RUN_DRY=1``): a lease is minutes long, so
a typo in the script or a tool it calls must fail here, not there."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~35 s; run it (python -m pytest -m slow) before spending device time on the script
def test_the_gpu_run_script_runs_every_step_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, GPU_RUN_DRY="1", STEER_UI_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(["bash", str(ROOT / "steer_ui" / "tools" / "gpu_run.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (out / "run.log").read_text()
    for step in ("tests exit 0", "bench random:llama-mini exit 0", "profile exit 0", "engine profile exit 0",
                 "many users exit 0", "done"):
        assert step in log, log[-3000:]
    bench = json.loads((out / "bench-cuda-llama-mini.json").read_text())
    assert "incomplete" not in bench and bench["greedy_vs_float32"]["status"] == "measured"
    assert bench["training"]["status"].startswith("skipped")
    assert "side-by-side step: median" in (out / "profile-step.txt").read_text()
    assert "rounds of 8 at once" in (out / "profile-engine.txt").read_text()
    many = json.loads((out / "many-users-float32.json").read_text().splitlines()[-1])
    assert many["many_users_exact"] == 8  # float32 on one device: the batch equals solo runs
