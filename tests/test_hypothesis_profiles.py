"""The property tests draw the same examples on every run unless the "dev" profile is chosen."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from conftest import DEV_SCALE, examples

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(settings.get_current_profile_name() != "ci", reason="another profile was chosen")
def test_a_property_with_its_own_example_count_stays_derandomized_without_a_database():
    own = settings(max_examples=examples(7))
    assert own.derandomize and own.database is None and own.deadline is None and own.max_examples == 7


def test_the_dev_profile_draws_random_examples_and_scales_each_tests_count():
    script = ("import sys; sys.path.insert(0, 'tests'); import conftest; from hypothesis import settings; "
              "s = settings(max_examples=conftest.examples(7)); print(s.derandomize, s.max_examples)")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "HYPOTHESIS_PROFILE": "dev"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", str(7 * DEV_SCALE)]
