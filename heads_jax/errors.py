"""Errors a user can fix: the CLI prints them as one line (no traceback) and exits with 2."""


class UserError(Exception):
  """Bad input, a missing file or model, an unusable setting: the message says what to do."""
