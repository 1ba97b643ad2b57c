"""The suite collects: no two test files share a basename (tests/ has no __init__.py files, so pytest imports each
by its basename, and a second one stops the whole run at collection; it did, once, at stop 55)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def shared_basenames(paths) -> list[str]:
    return sorted(name for name, n in Counter(Path(p).name for p in paths).items() if n > 1)


def test_no_two_test_files_share_a_basename():
    assert shared_basenames(TESTS.rglob("test_*.py")) == []


def test_the_check_sees_a_shared_basename():
    assert shared_basenames(["unit/test_a.py", "browser/test_a.py", "unit/test_b.py"]) == ["test_a.py"]
