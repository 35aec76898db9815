"""The one base class of errors meant for a user: a setting, a file or a run directory that
cannot work. `main.py` prints such an error as one paragraph and exits with status 1 (no
traceback; `--verbosity=1` or GATED_ATTENTION_TRACEBACK=1 shows it). Anything else is a bug and
keeps its traceback."""


class UserError(Exception):
  """The message names the problem and the fix."""


class ConfigError(UserError, ValueError):
  """A config value that cannot work (names the --config field)."""


class CheckpointError(UserError, ValueError):
  """A run directory or checkpoint that cannot be used; the message says what to do."""


class StorageError(UserError, OSError):
  """Object storage that cannot be used (bucket, credentials, endpoint, a path it cannot carry,
  a stalled request); names the fix."""
