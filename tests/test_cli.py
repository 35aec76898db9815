"""The command line (gated_attention/cli.py) and the mode table it reads (modes/__init__.py):
each mode takes the flags its row names, a flag of another mode is refused by name, a config
file's misspelt field is refused at the start, and `--step` names the checkpoint for every mode
that opens one."""

import os
import re

import ml_collections
import pytest

from experiments import processes
from gated_attention import modes

HINT = '(--verbosity=1 or GATED_ATTENTION_TRACEBACK=1 shows the traceback.)'


def main_py(tmp_path, *argv) -> tuple[int, str]:
  """main.py's exit status and output (forked from the runner's preloaded server)."""
  log = str(tmp_path / 'main.log')
  rc, _ = processes.call(['main.py', *argv], log)   # pylint: disable=protected-access
  with open(log) as f:
    return rc, f.read()


def test_the_table_and_the_flags_agree():
  """Every row's flags are declared in FLAGS, every flag is some mode's, and the checkpoint is
  spelt one way: --step, for each mode that opens a run's checkpoint."""
  named = {f for m in modes.MODES.values() for f in m.flags}
  assert named == set(modes.FLAGS)
  opens_a_checkpoint = {'analyze', 'sample', 'export', 'long_context', 'quantization'}
  assert {m.name for m in modes.MODES.values() if 'step' in m.flags} == opens_a_checkpoint
  for m in modes.MODES.values():
    assert m.load().main, m.name      # every row's module loads and has main(args)


def test_args_hold_only_the_modes_own_flags():
  args = modes.Args(config=ml_collections.ConfigDict(), mode='sample',
                    options={'prompts': ('a',), 'step': 3})
  assert args.prompts == ('a',) and args.step == 3
  with pytest.raises(AttributeError, match="--mode=sample takes no flag 'seeds'"):
    args.seeds   # pylint: disable=pointless-statement


@pytest.mark.parametrize('argv,match', [
    (['--mode=train', '--prompt=hello'],
     '--prompt belongs to --mode=sample; --mode=train does not take it'),
    (['--mode=analyze', '--seeds=0,1'],
     '--seeds belongs to --mode=train; --mode=analyze does not take it'),
    (['--mode=params', '--step=3'],
     '--step belongs to --mode=analyze / --mode=export / --mode=sample / --mode=long_context / '
     '--mode=quantization; --mode=params does not take it'),
    (['--mode=train', '--seeds=0,1', '--analyze'],
     '--analyze analyses a run after --mode=train of one seed'),
    (['--mode=train', '--fit_grad_accum'],
     '--fit_grad_accum belongs to --mode=memory / --mode=compile; --mode=train does not take it'),
    (['--mode=memory', '--plan=long_context', '--fit_grad_accum'],
     "--fit_grad_accum walks the train step's grad_accum; --plan=long_context plans the "
     'evaluation'),
])
def test_a_flag_the_mode_does_not_take_is_one_paragraph(tmp_path, argv, match):
  work = tmp_path / 'run'
  rc, text = main_py(tmp_path, *argv, f'--workdir={work}')
  assert rc == 1, text
  assert 'Traceback' not in text and text.count(HINT) == 1, text
  assert match in ' '.join(text.split()), text
  assert not work.exists()           # refused before anything is written


def test_help_names_the_modes_of_each_flag(tmp_path):
  rc, text = main_py(tmp_path, '--helpfull')
  flat = ' '.join(text.split())
  assert rc == 0 and 'Error' not in text, text     # absl's own --helpfull exits with status 1
  assert ('--mode=analyze, export, sample, long_context, quantization: which checkpoint'
          in flat), text
  assert '--mode=sample: a prompt (repeat for a batch).' in flat


@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_every_mode_in_one_line_and_the_common_flags(tmp_path, flag):
  rc, text = main_py(tmp_path, flag)
  assert rc == 0 and 'Error' not in text, text
  lines = text.splitlines()
  start = lines.index('Modes (--mode=):')
  rows = lines[start + 1:start + 1 + len(modes.MODES)]
  assert [r.split()[0] for r in rows] == list(modes.MODES), rows
  for row, m in zip(rows, modes.MODES.values()):     # one line each: the mode's whole help
    assert row.split(None, 1)[1] == m.help
  for common in ('--config=FILE[:SCALE]', '--config.SECTION.FIELD=V', '--workdir=DIR',
                 '--mode=MODE'):
    assert any(line.startswith(f'  {common} ') for line in lines), common
  for name in modes.FLAGS:                           # and which modes take each mode flag
    assert any(line.split()[:1] == [f'--{name}'] for line in lines), name
  assert '--seeds' in text and 'data.mixture' in text and '--mode=tokenize' in text


def test_help_of_a_mode_explains_its_flags(tmp_path):
  rc, text = main_py(tmp_path, '--mode=sample', '--help')
  flat = ' '.join(text.split())
  assert rc == 0, text
  assert 'Flags of --mode=sample:' in text
  assert '--prompt a prompt (repeat for a batch).' in flat
  assert '--max_new_tokens tokens to generate per prompt. (default 128)' in flat


def test_config_mode_prints_the_resolved_config(tmp_path):
  """A new run's config with the overrides applied (JSON on stdout, notes on stderr); a bad
  value is refused as a run would refuse it."""
  rc, text = main_py(tmp_path, '--mode=config', '--config=configs/g1_headwise.py:moe_tiny',
                     '--config.train.steps=37', '--config.train.grad_accum=auto',
                     '--config.data.seq_len=64')
  assert rc == 0, text
  body = text[text.index('{'):text.rindex('}') + 1]
  import json  # pylint: disable=g-import-not-at-top
  config = json.loads(body)
  assert config['variant'] == 'g1_headwise' and config['scale'] == 'moe_tiny'
  assert config['train']['steps'] == 37 and config['train']['grad_accum'] == 'auto'
  assert config['data']['seq_len'] == 64 and config['model']['moe']['num_experts'] == 8
  assert 'Checked: the schema, the model, the loop' in text
  rc, text = main_py(tmp_path, '--mode=config', '--config.model.num_heads=3')
  assert rc == 1 and 'config.model.num_heads: 3 must be a multiple of num_kv_heads=2' in text
  rc, text = main_py(tmp_path, '--mode=config', '--config.train.stepz=3')
  assert rc == 1 and 'Did you mean "steps" instead of "stepz"' in ' '.join(text.split())


def test_config_mode_of_a_run_directory(tmp_path):
  """--workdir of a run without --config: its saved config with the overrides, as --mode=train
  would resume it; with another --config, what the run would refuse is named."""
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  hf = os.path.join(os.path.dirname(__file__), 'fixtures', 'hf', 'elementwise_tied')
  run = str(tmp_path / 'imported')
  interop.import_run(hf, run)
  rc, text = main_py(tmp_path, '--mode=config', f'--workdir={run}', '--config.train.steps=11')
  assert rc == 0, text
  assert f'No --config given: continuing with the saved config of {run}' in text
  assert '"steps": 11' in text and '"variant": "g1_elementwise"' in text
  rc, text = main_py(tmp_path, '--mode=config', f'--workdir={run}',
                     '--config=configs/baseline.py')
  assert rc == 0, text
  assert '--mode=train would refuse to continue it with this one' in text
  assert "model.gate.position: saved 'g1', now 'none'" in text, text


def test_step_opens_that_checkpoint_or_names_those_there_are(tmp_path):
  """--step on an imported run (one checkpoint, step 0): analyze refuses a step it lacks, naming
  the steps there are, before any work."""
  from gated_attention.runs.hf import interop  # pylint: disable=g-import-not-at-top
  hf = os.path.join(os.path.dirname(__file__), 'fixtures', 'hf', 'elementwise_tied')
  run = str(tmp_path / 'imported')
  interop.import_run(hf, run)
  rc, text = main_py(tmp_path, '--mode=analyze', f'--workdir={run}', '--step=7')
  assert rc == 1 and 'has no checkpoint at step 7; it has [0]' in ' '.join(text.split()), text
  assert not os.path.exists(os.path.join(run, 'analysis'))


def test_fit_grad_accum_prints_each_attempt_then_the_smallest_that_fits(tmp_path):
  """--mode=memory --fit_grad_accum on a tiny config: one line per grad_accum tried, doubling
  from the config's, the last the first that fits; then its report."""
  rc, text = main_py(tmp_path, '--config=configs/g1_elementwise.py:tiny', '--mode=memory',
                     '--fit_grad_accum', '--config.train.batch_size=64',
                     '--config.memory.device_memory_gib=0.05')
  assert rc == 0, text
  tried = [line for line in text.splitlines() if line.startswith('grad_accum=')]
  found = int(re.search(r'^Smallest grad_accum that fits .*: (\d+)\.$', text, re.M).group(1))
  assert [int(t.split()[0].split('=')[1]) for t in tried] == [2 ** i for i in range(len(tried))]
  assert tried[-1].startswith(f'grad_accum={found} (') and ': fits: ' in tried[-1]
  assert found > 1 and all(': does NOT fit: ' in t for t in tried[:-1])
  assert f'"grad_accum": {found},' in text and '"fit_grad_accum"' in text
