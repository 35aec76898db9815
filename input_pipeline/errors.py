"""The one error type of the input pipeline."""


class DataError(ValueError):
  """A data or tokenizer setting that cannot work; the message names the setting and the fix."""
