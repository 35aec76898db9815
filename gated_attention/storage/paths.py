"""Paths of the storage layer, as strings (no request is made here): a path with a scheme
(`gs://bucket/x`) is remote, anything else (`file://` included) is local and keeps the plain os
calls."""

import os
import posixpath
import re

_SCHEME = re.compile(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://')


def scheme(path: str) -> str | None:
  """'gs' for gs://bucket/x, None for a local path (file:// counts as local)."""
  m = _SCHEME.match(str(path))
  return None if m is None or m.group(1) == 'file' else m.group(1)


def is_remote(path: str) -> bool:
  return scheme(path) is not None


def local(path: str) -> str:
  """A local path without its `file://`."""
  return str(path)[len('file://'):] if str(path).startswith('file://') else str(path)


def abspath(path: str) -> str:
  """A local path made absolute; a remote URL without a trailing slash."""
  return path.rstrip('/') if is_remote(path) else os.path.abspath(local(path))


def join(path: str, *parts: str) -> str:
  if is_remote(path):
    return posixpath.join(path, *parts)
  return os.path.join(path, *parts)


def dirname(path: str) -> str:
  return posixpath.dirname(path.rstrip('/')) if is_remote(path) else os.path.dirname(path)


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip('/')) if is_remote(path) else os.path.basename(path)
