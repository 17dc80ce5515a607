"""The mutation gate's list (tests/mutants.toml) still fits the code: every snippet occurs once in its file, every
test file exists, at least 25 mutants. The gate itself (.ci/mutants, several minutes) runs in .ci/run; this check
is here so that a change that moves a snippet fails the ordinary suite at once, naming the mutant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_mutant_list_matches_the_source():
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "mutants"), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "every snippet found once" in done.stdout


def test_a_rotten_snippet_fails_the_check(tmp_path):
    """The check is real: a list whose snippet is not in the source is refused, naming the mutant."""
    source = (ROOT / ".ci" / "mutants").read_text()
    rotten = tmp_path / "mutants.toml"
    entries = (ROOT / "tests" / "mutants.toml").read_text()
    rotten.write_text(entries.replace('original = "    if size > limit:"', 'original = "    if size > limit + 2:"', 1))
    script = tmp_path / "mutants"
    source = source.replace("ROOT = Path(__file__).resolve().parent.parent", f"ROOT = Path({str(ROOT)!r})")
    script.write_text(source.replace('LIST = ROOT / "tests" / "mutants.toml"', f"LIST = Path({str(rotten)!r})"))
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode != 0
    assert "server-response-limit-plus-one" in done.stderr and "occurs 0 times in server/sizes.py" in done.stderr
