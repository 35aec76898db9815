"""training/profile.py: a window of steps traced into RUN/profile/ (local and gs://), the files
TensorBoard / XProf and Perfetto read, parsed here without their tools."""

import gzip
import json
import os
import socket

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from gated_attention import storage
from gated_attention.errors import ConfigError
from gated_attention.training import profile


def protobuf_fields(buf: bytes) -> list[tuple[int, int, object]]:
  """(field number, wire type, value) of each field of a protobuf message, by the wire format
  alone; raises ValueError on bytes that are not one."""
  i, out = 0, []

  def varint():
    nonlocal i
    shift = value = 0
    while True:
      if i >= len(buf):
        raise ValueError('truncated varint')
      b = buf[i]
      i += 1
      value |= (b & 0x7f) << shift
      if not b & 0x80:
        return value
      shift += 7

  while i < len(buf):
    key = varint()
    number, wire = key >> 3, key & 7
    if number == 0:
      raise ValueError('field number 0')
    if wire == 0:
      value = varint()
    elif wire in (1, 5):
      value, i = buf[i:i + (8 if wire == 1 else 4)], i + (8 if wire == 1 else 4)
    elif wire == 2:
      n = varint()
      value, i = buf[i:i + n], i + n
    else:
      raise ValueError(f'wire type {wire}')
    if i > len(buf):
      raise ValueError('truncated field')
    out.append((number, wire, value))
  return out


def xspace_summary(data: bytes) -> dict:
  """An XSpace (tsl/profiler/protobuf/xplane.proto: planes = 1, hostnames = 4; a plane's
  name = 2, event_metadata = 4, a map whose values' name = 2): {plane name: event names}."""
  planes = {}
  for number, _, plane in protobuf_fields(data):
    if number != 1:
      continue
    fields = protobuf_fields(plane)
    name = next(v for n, _, v in fields if n == 2).decode()
    events = set()
    for n, _, entry in fields:
      if n == 4:
        for n2, _, meta in protobuf_fields(entry):
          if n2 == 2:
            events.update(v.decode(errors='replace') for n3, _, v in protobuf_fields(meta)
                          if n3 == 2)
    planes[name] = events
  return planes


def trace_of(folder: str) -> dict:
  """The files of the one trace under RUN/profile/plugins/profile/<name>/."""
  root = storage.join(folder, 'profile', 'plugins', 'profile')
  names = storage.listdir(root)
  assert len(names) == 1, names
  files = storage.listdir(storage.join(root, names[0]))
  return {f: storage.read_bytes(storage.join(root, names[0], f)) for f in files}


def check_trace(files: dict, steps: list[int]):
  host = f'{socket.gethostname()}_p0'
  assert sorted(files) == sorted(f'{host}{s}' for s in ('.xplane.pb', '.trace.json.gz',
                                                          '.perfetto_trace.json.gz')), files
  planes = xspace_summary(files[f'{host}.xplane.pb'])
  cpu = next(p for p in planes if p.startswith('/host:CPU'))
  assert 'train' in planes[cpu]                # the step annotation
  for name in ('.trace.json.gz', '.perfetto_trace.json.gz'):
    trace = json.loads(gzip.decompress(files[host + name]))
    traced = sorted(int(e['args']['step_num']) for e in trace['traceEvents']
                    if e.get('name') == 'train')
    assert traced == steps, (name, traced)


def _train(tc, workdir, first_step, last_step):
  """A loop of jitted 'steps' with the profiler's hooks, as training/loop.py calls them."""
  profiler = profile.Profiler(tc, workdir, first_step, say=lambda text: None)
  f = jax.jit(lambda w, x: jnp.tanh(w @ x) @ x.T)
  w = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32)
  for step in range(first_step + 1, last_step + 1):
    profiler.before(step)
    with profiler.annotate(step):
      w = w + 1e-3 * f(w, w)
    profiler.after(step, w)
  profiler.close(last_step)
  return profiler


@pytest.mark.parametrize('where', ['local', 'gcs'])
def test_a_window_of_steps_is_traced_and_parses(where, tmp_path, request):
  workdir = (request.getfixturevalue('gcs').url('runs/p') if where == 'gcs'
             else str(tmp_path / 'run'))
  tc = ml_collections.ConfigDict({'profile_steps': 3, 'profile_start': 0,
                                  'profile_processes': 'first'})
  profiler = _train(tc, workdir, first_step=4, last_step=10)
  assert (profiler.first, profiler.last) == (7, 9)       # the session's 3rd step on
  check_trace(trace_of(workdir), [7, 8, 9])


def test_a_run_stopped_inside_the_window_keeps_what_it_traced(tmp_path):
  workdir = str(tmp_path / 'run')
  tc = ml_collections.ConfigDict({'profile_steps': 50, 'profile_start': 2,
                                  'profile_processes': 'all'})
  profiler = _train(tc, workdir, first_step=0, last_step=4)
  check_trace(trace_of(workdir), [2, 3, 4])
  assert not os.path.exists(profiler.local)        # the local copy is gone


def test_no_trace_without_profile_steps_or_behind_the_session(tmp_path):
  said = []
  off = ml_collections.ConfigDict({'profile_steps': 0, 'profile_start': 0,
                                   'profile_processes': 'first'})
  assert profile.Profiler(off, str(tmp_path), 0, say=said.append).first == -1
  behind = ml_collections.ConfigDict({'profile_steps': 5, 'profile_start': 20,
                                      'profile_processes': 'first'})
  assert profile.Profiler(behind, str(tmp_path), 40, say=said.append).first == -1
  assert 'profile_start=20' in said[0] and 'resumes after step 40' in said[0]
  assert not os.path.exists(tmp_path / 'profile')


@pytest.mark.parametrize('field,value,message', [
    ('profile_steps', -1, 'must be >= 0'), ('profile_start', -3, 'must be >= 0'),
    ('profile_processes', 'some', 'one of first, all')])
def test_bad_settings_are_refused(field, value, message):
  tc = ml_collections.ConfigDict({'profile_steps': 2, 'profile_start': 0,
                                  'profile_processes': 'first'})
  tc[field] = value
  with pytest.raises(ConfigError, match=message):
    profile.check_config(tc)
