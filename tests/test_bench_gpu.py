"""bench/bench_gpu.py on a machine without CUDA: a clear message and exit status 0, nothing measured."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the benchmark would run")
def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "no CUDA device on this machine" in done.stdout + done.stderr
    assert "nothing measured" in done.stdout + done.stderr
    assert not any(tmp_path.iterdir())  # no results written
