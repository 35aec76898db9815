"""The one error type of the input pipeline."""

from gated_attention.errors import UserError


class DataError(UserError, ValueError):
  """A data or tokenizer setting that cannot work; the message names the setting and the fix."""
