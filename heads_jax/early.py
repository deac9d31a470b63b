"""A command's checks that need no heavy import (no JAX, Flax, pandas or huggingface_hub): the
entry points run them before they import their job, so a bad model path, data spec or output
folder is refused in a second or two, not after a minute of imports.

Each check raises the job's own one-line `UserError` (the job checks again, with everything
loaded; these only answer sooner)."""

from __future__ import annotations

import re
from pathlib import Path

from heads_jax.errors import UserError

# A hub id: ``name`` or ``org/name`` of letters, digits, ``_.-`` (`heads_jax.hub` resolves it).
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")


def looks_like_repo_id(name: str) -> bool:
  """``name`` or ``org/name`` of letters, digits, ``_.-`` (no ``..``, no path of more parts)."""
  return bool(REPO_ID.fullmatch(name)) and ".." not in name and not name.endswith((".json", ".txt"))


def _is_url(name: str) -> bool:
  return "://" in name


def check_model(name, flag: str = "--model") -> None:
  """A model argument that is neither an existing path, a URL nor a hub id (``org/name``)."""
  s = str(name)
  if not s or (not _is_url(s) and not Path(s).expanduser().exists()
               and not looks_like_repo_id(s)):
    raise UserError(f"{flag} {s}: model path {Path(s).expanduser()} does not exist (give a "
                    "model directory, a hub id such as bert-base-uncased, or a gs:// path)")


def check_data(specs, flag: str = "--data") -> None:
  """Data specs that do not parse, or name a file that does not exist (`data.specs.parse_spec`:
  light, no JAX)."""
  from heads_jax.data.specs import parse_spec
  for spec in specs or ():
    try:
      parse_spec(spec)
    except ValueError as e:
      raise UserError(str(e)) from None


def check_out(out, flag: str = "--out") -> None:
  """An output path that is an existing file (a job writes a directory)."""
  s = str(out)
  if not _is_url(s) and Path(s).expanduser().is_file():
    raise UserError(f"{flag} {s} is a file; give a directory (a new one, or an earlier run's)")
