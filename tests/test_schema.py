"""The run config's schema (gated_attention/config/schema.py): one declaration of every field,
unknown keys and wrong kinds refused by name, what a saved run may change as field metadata."""

import dataclasses
import glob
import importlib
import os

import pytest

from gated_attention.config import scales, schema
from gated_attention.errors import ConfigError
from gated_attention.model import config as model_lib
from gated_attention.input_pipeline import synthetic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, 'configs', '*.py'))
                  if os.path.basename(p) not in ('__init__.py', 'base.py', 'from_run.py',
                                                 'extend_context.py'))


def _sections(spec=schema.RunConfig, prefix=''):
  for f in dataclasses.fields(spec):
    section = f.metadata.get('section')
    if section and section is not model_lib.ModelConfig:
      yield prefix + f.name, section
      yield from _sections(section, f'{prefix}{f.name}.')


def test_the_defaults_are_the_dataclasses_fields():
  """Every section's keys and defaults are its dataclass's fields, in order; the model's are
  ModelConfig's (config_defaults); the tiny scale changes only what it says it does."""
  d = schema.defaults()
  assert list(d) == [f.name for f in dataclasses.fields(schema.RunConfig)]
  assert d['model'] == model_lib.config_defaults()[0]
  for path, spec in _sections():
    node = d
    for part in path.split('.'):
      node = node[part]
    assert list(node) == [f.name for f in dataclasses.fields(spec)], path
    instance = spec()
    for f in dataclasses.fields(spec):
      if 'section' not in f.metadata:
        assert node[f.name] == getattr(instance, f.name), (path, f.name)
  tiny = scales.get_config('tiny').to_dict()
  assert tiny['model'] == dict(d['model'], scan_layers=False)
  assert {k: v for k, v in tiny.items() if k != 'model'} == {
      k: v for k, v in d.items() if k != 'model'}


def test_synthetic_defaults_are_declared_once():
  """data.synthetic's defaults reach the task unchanged (TaskSpec has none of its own)."""
  assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(synthetic.TaskSpec))
  data = scales.data_config()
  spec = synthetic.TaskSpec.from_config(data)
  for f in dataclasses.fields(schema.Synthetic):
    if f.name != 'doc_len':
      assert getattr(spec, f.name) == f.default, f.name
  assert spec.doc_len == data.seq_len + 1


@pytest.mark.parametrize('scale', scales.SCALES)
def test_every_variant_at_every_scale_passes_the_check(scale):
  checked = 0
  for variant in VARIANTS:
    try:
      c = importlib.import_module(f'configs.{variant}').get_config(scale)
    except ValueError as e:      # a variant of another kind of model (more experts: MoE only)
      assert 'needs an MoE scale' in str(e)
      continue
    schema.check(c)
    checked += 1
    assert c.variant == variant
  assert checked >= len(VARIANTS) - 1


def test_unknown_keys_are_refused_by_name_with_the_one_meant():
  c = scales.get_config('tiny')
  c.train.stepz = 10            # ml_collections adds it without a word
  c.data.synthetic.pairz = 2
  with pytest.raises(ConfigError, match=r'data\.synthetic\.pairz \(did you mean '
                     r'data\.synthetic\.pairs\?\); train\.stepz \(did you mean train\.steps\?\)'):
    schema.check(c, where='--config=x.py')
  c = scales.get_config('tiny')
  c.zzz_section = {'a': 1}
  with pytest.raises(ConfigError, match=r'zzz_section \(the fields of the config: variant, '):
    schema.check(c)
  c = scales.get_config('tiny')
  c.hf = {'source': '/models/qwen'}   # an imported run's record of its source
  schema.check(c)


def test_values_of_another_kind_are_refused():
  c = scales.get_config('tiny').to_dict()
  c['train']['steps'] = '10'
  c['data']['document_mask'] = 1
  c['mesh'] = 'fsdp'
  with pytest.raises(ConfigError, match=r"data\.document_mask is 1, not true / false; "
                     r"train\.steps is \"10\", not a number; mesh is \"fsdp\", not an object"):
    schema.check(c)
  ok = scales.get_config('tiny').to_dict()
  ok['train']['learning_rate'] = 1       # an int where a float belongs is a number
  ok['train']['steps'] = 10.0            # a whole float where an int belongs too
  schema.check(ok)


def test_what_a_saved_run_may_change_is_field_metadata():
  assert schema.fixed_fields(schema.CHECKPOINT) == ('data.tokenizer',)
  iterator = schema.fixed_fields(schema.ITERATOR)
  assert {'seed', 'train.batch_size', 'data.seq_len', 'data.source', 'data.synthetic',
          'data.task'} <= set(iterator)
  assert not any(p.startswith('data.synthetic.') for p in iterator)  # the section is one path
  free = {'train.steps', 'train.learning_rate', 'data.val_batches', 'data.device_prefetch',
          'mesh.fsdp', 'analysis.num_batches', 'long_context.lengths'}
  assert not free & (set(iterator) | set(schema.fixed_fields(schema.CHECKPOINT)))
  # the model's: fixed unless marked free (model/config.py); these two change no parameter
  assert {'scan_layers', 'fused_gate_projection'} <= set(model_lib.free_fields('resume'))
  assert 'rope_scaling' in model_lib.free_fields('evaluation')
  assert 'hidden_size' not in model_lib.free_fields('evaluation')
