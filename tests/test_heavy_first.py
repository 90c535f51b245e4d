"""``tests/conftest.py``'s ``HEAVY_FIRST`` (the files sent to the workers first, longest first) names
test files that exist, each once: a renamed or split file would otherwise drop out of the order
silently and could run last, the run waiting on one worker for it."""
from pathlib import Path

from conftest import HEAVY_FIRST

TESTS = Path(__file__).resolve().parent


def test_every_heavy_first_name_is_a_test_file_of_this_folder_and_named_once():
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST), "a file named twice"
    missing = [name for name in HEAVY_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"HEAVY_FIRST names no such test file: {missing}"
