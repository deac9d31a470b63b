"""A normal run's console: no library chatter, a Python warning is one plain line (no source
line), harmless numerical warnings silenced; --debug keeps the libraries' own output."""

import subprocess
import sys

SCRIPT = r"""
import logging, warnings, sys
import numpy as np
from heads_jax import cli
if sys.argv[1] == "quiet":
  cli.quiet_console("analyze")
np.nanmean(np.array([]))                       # RuntimeWarning: Mean of empty slice
np.nanmean(np.full((2, 2), np.nan), 0)         # RuntimeWarning: All-NaN slice / Mean of empty slice
np.var(np.ones(1), ddof=1)                     # RuntimeWarning: Degrees of freedom <= 0
warnings.warn("model: freshly initialised (not in the\n checkpoint): bert.pooler")
warnings.warn("old API", FutureWarning)
import absl.logging
absl.logging.warning("orbax chatter")
absl.logging.error("an absl error")
logging.getLogger("transformers").warning(
    "PyTorch was not found. Models won't be available and only tokenizers, configuration and "
    "file/data utilities can be used.")
logging.getLogger("transformers").warning("a transformers warning of substance")
"""


def _stderr(mode):
  return subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                        check=True).stderr


def test_quiet_console_keeps_only_what_matters():
  lines = _stderr("quiet").strip().splitlines()
  assert lines[0] == ("heads-jax analyze: warning: model: freshly initialised (not in the "
                      "checkpoint): bert.pooler")
  assert "an absl error" in lines[1]
  assert "a transformers warning of substance" in lines[2]
  assert len(lines) == 3, lines


def test_without_it_the_libraries_print_everything():
  """The same script unquieted: every line the quiet console drops is there (so the test above
  tests the filters, not a script that prints nothing)."""
  err = _stderr("loud")
  for text in ("Mean of empty slice", "Degrees of freedom", "UserWarning", "FutureWarning",
               "orbax chatter", "PyTorch was not found"):
    assert text in err, text
