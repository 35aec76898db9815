"""Errors of the Hugging Face interop; each message names the field (or tensor) and the fix."""

from gated_attention.errors import UserError


class HFFormatError(UserError, ValueError):
  """A Hugging Face model directory this project cannot read or represent (import)."""


class HFExportError(UserError, ValueError):
  """A run (config, parameters or output directory) that cannot be exported."""
