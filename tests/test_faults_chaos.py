"""experiments/chaos.py with 2 kills: between two dynamic-sampling rounds and inside an
asynchronous save; the resumed run must equal the clean one bitwise (about 4 process starts)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import chaos  # noqa: E402  pylint: disable=wrong-import-position

# Starts processes of its own (real signals, deadlines): under `pytest -n 2` these modules share
# one worker (--dist loadgroup), so two of them never compete for the 2 cores.
pytestmark = pytest.mark.xdist_group("subprocess")


def test_draw_is_seeded_and_covers_rounds_and_saves():
  rounds = {1: 2, 2: 3, 3: 2, 4: 2, 5: 2, 6: 2}
  assert chaos.draw(5, 1, 7, rounds) == chaos.draw(5, 1, 7, rounds)
  points = chaos.draw(2, 2, 3, {1: 2, 2: 2})
  assert points == [("round", 1, 1), ("save", 2, 0)]
  for seed in range(10):
    kinds = {k for k, _, _ in chaos.draw(4, seed, 6, rounds)}
    assert kinds == set(chaos.KINDS)


def test_two_kills_resume_identical(tmp_path, capsys):
  assert chaos.main(["--kills=2", "--seed=2", "--steps=3", f"--workdir={tmp_path}"]) == 0
  out = capsys.readouterr().out.strip().splitlines()
  assert out[-1] == "2/2 resumed runs identical", "\n".join(out[-8:])
  assert any("round @ step 1 round 1" in line and "identical" in line for line in out)
  assert any("save @ step 2" in line and "identical" in line for line in out)
