"""docs/inference.md's commands at scale, run on the CPU at a small scale: the golden release
fixtures (tests/fixtures/hf: a stock Qwen3 baseline and a model in the authors' gated layout,
written by transformers) imported, then the three long-context evaluations (the full cache, a
window, a window with sinks) and the quantized evaluation, with the guide's overrides."""

import json
import os

import numpy as np
import pytest

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures', 'hf')


@pytest.fixture(scope='module')
def releases(tmp_path_factory):
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('releases')
  rng = np.random.default_rng(0)
  data = root / 'docs.jsonl'
  with open(data, 'w') as f:          # the fixtures' word-level vocabulary: w0 ... w95
    for _ in range(200):
      f.write(json.dumps({'text': ' '.join(f'w{i}' for i in rng.integers(0, 96, 80))}) + '\n')
  runs = {}
  for case in ('baseline_tied', 'headwise_untied'):
    runs[case] = str(root / case)
    interop.import_run(os.path.join(FIXTURES, case), runs[case])
  return runs, str(data)


@pytest.mark.slow  # two imported models, four evaluations each: ~2-3 minutes on the loaded CPU
@pytest.mark.parametrize('case', ['baseline_tied', 'headwise_untied'])
def test_the_guides_evaluations_on_imported_releases(releases, case):
  from gated_attention.modes import long_context, quantization  # pylint: disable=g-import-not-at-top
  runs, data = releases
  run = runs[case]
  common = {'data.source': 'jsonl', 'data.path': data, 'model.dtype': 'bfloat16',
            'long_context.lengths': '16,32,64', 'long_context.docs': 4,
            'long_context.batch_size': 2, 'long_context.tasks': '', 'long_context.chunk': 16}
  reports = {
      'full': long_context.run(run, overrides={**common, 'long_context.tag': 'full'}),
      'window': long_context.run(run, overrides={**common, 'long_context.tag': 'window',
                                                 'long_context.window': 16}),
      'sinks': long_context.run(run, overrides={**common, 'long_context.tag': 'sinks',
                                                'long_context.window': 12,
                                                'long_context.sinks': 4})}
  first = [r['loss']['buckets'][0]['loss'] for r in reports.values()]
  assert first == pytest.approx([first[0]] * 3, rel=2e-2)   # nothing evicted before 16 (bf16)
  assert reports['sinks']['cache']['slots'] == reports['window']['cache']['slots'] == 16
  for tag in reports:
    assert os.path.isfile(os.path.join(run, 'long_context', tag, 'report.json'))
  rep = quantization.run(run, overrides={
      'data.source': 'jsonl', 'data.path': data, 'model.dtype': 'bfloat16', 'data.seq_len': 32,
      'quantization.batch_size': 2, 'quantization.num_batches': 2,
      'quantization.group_size': 16,
      'quantization.settings': 'w8a16,w4a16,w16a8,w8a8,w4a8'})
  assert [s['key'] for s in rep['settings']] == [
      'w8a16', 'w4a16', 'w16a8_tensor', 'w16a8_token', 'w8a8_tensor', 'w8a8_token',
      'w4a8_tensor', 'w4a8_token']
  assert np.isfinite([s['loss'] for s in rep['settings']]).all()
  gated = case.startswith('headwise')
  assert ('blocks.attn.gate.kernel' in rep['weights_quantized']) == gated
  assert os.path.isfile(os.path.join(run, 'quantization', 'quantization.md'))
