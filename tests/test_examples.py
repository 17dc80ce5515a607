"""The example scripts run as a person runs them, offline, and do what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_train_classifier_learns_and_prints_a_mix_build_accepts(tmp_path):
    """With the bundled model (no --model) and no --workdir: its temporary folder is gone afterwards."""
    command = [sys.executable, str(ROOT / "examples" / "train_classifier.py"), "--epochs", "6", "--workers", "0"]
    temp = tmp_path / "tmp"
    temp.mkdir()
    environment = {**os.environ, "TMPDIR": str(temp)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stderr
    assert "with Encoder(name='bundled'" in done.stdout, done.stdout
    # The caches' temporary folder was removed (torch may leave its own compile cache there).
    assert [p.name for p in temp.iterdir() if p.name.startswith("elmo_cache_example_")] == []
    before = float(re.search(r"before training: ([0-9.]+)", done.stdout).group(1))
    after = [float(x) for x in re.findall(r"test accuracy ([0-9.]+)", done.stdout)]
    assert len(after) == 6 and after[-1] > max(before, 0.6) + 0.05, done.stdout
    args = re.search(r"elmo-cache build CORPUS (.+)", done.stdout).group(1).split()
    assert args[0] == "--mix" and "--mix-softmax" in args and "--gamma" in args
