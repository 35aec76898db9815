"""The experiment runner (experiments/run.py) end to end on a two-run, ten-step experiment."""

import dataclasses
import json
import os
import re
import shlex
import shutil
import textwrap

import numpy as np
import pytest

from experiments import (figures, processes, rundata, run, running, sections, spec, stability, stats,
                         tables)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXPERIMENT = textwrap.dedent('''\
    """Tiny runner check

    Two ten-step runs of a one-layer model on the Bigram-Backcopy task.
    """
    VARIANTS = ['baseline', 'g1_elementwise']
    SEEDS = [0]
    OVERRIDES = {
        'data.source': 'synthetic', 'data.seq_len': 32, 'data.val_batches': 1,
        'data.synthetic.vocab': 16, 'model.num_layers': 1, 'model.hidden_size': 32,
        'model.num_heads': 2, 'model.num_kv_heads': 1, 'model.head_dim': 16,
        'model.ffn_size': 64, 'train.steps': 10, 'train.batch_size': 4, 'train.warmup_steps': 2,
        'train.log_every': 5, 'train.eval_every': 10, 'train.checkpoint_every': 10,
    }
    COLUMNS = ['val_loss', 'f_attn_mean', 'f_attn_layers', 'm_act_mean', 'gate_score_mean',
               'train_minutes']
    ''')


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """(experiment file, output dir, results.md) after one full invocation of the runner."""
  root = tmp_path_factory.mktemp('experiment')
  path, out, results = root / 'tiny.py', root / 'out', root / 'docs' / 'results.md'
  path.write_text(EXPERIMENT)
  results.parent.mkdir()
  results.write_text('# Results\n\nKept text.\n')
  rc = run.main([str(path), '--out', str(out), '--jobs', '2', '--results', str(results)])
  assert rc == 0
  return path, out, results


def _table_rows(text):
  return [line for line in text.splitlines() if line.startswith('| ')]


def test_table_figures_and_records(finished):
  _, out, results = finished
  for name in sections.figure_names(spec.load(str(finished[0]), rundata.METRICS)) + (
      'results.md', 'summary.json'):
    assert (out / name).stat().st_size > 0
  rows = _table_rows((out / 'results.md').read_text())
  assert rows[0].startswith('| run | seeds done | val loss | F-Attn |')
  assert rows[1].startswith('| baseline | 1/1 |') and rows[2].startswith('| g1_elementwise | 1/1 |')
  assert rows[1].split(' | ')[6] == '-' and float(rows[2].split(' | ')[6]) > 0  # gate score
  assert len(rows[1].split(' | ')[4].split(' / ')) == 1  # F-Attn per layer: one layer
  summary = json.loads((out / 'summary.json').read_text())
  loss = summary['baseline']['val_loss']
  assert loss['values'][0] == pytest.approx(loss['mean'])
  assert 1.0 < loss['mean'] < 5.95  # below ln 384, the loss of the untrained model
  state = json.loads((out / 'runs' / 'baseline_s0' / 'runner.json').read_text())
  assert state['status'] == 'done' and state['train_seconds'] > 0 and state['attempts'] == 1
  assert '--config.train.steps=10' in state['command']
  # The runs and their analyses share a persistent compilation cache (OUT/xla_cache).
  assert f'--config.compilation_cache={out / "xla_cache"}' in state['command']
  assert f'--config.compilation_cache={out / "xla_cache"}' in state['analyze_command']
  assert len(os.listdir(out / 'xla_cache')) > 4
  # Analysed by the training command (main.py --analyze), not by a second process.
  assert state['command'].endswith(' --analyze') and state['analyzed_in_training']
  assert state['analyze_seconds'] == 0.0 and not (out / 'runs' / 'baseline_s0' / 'analyze.log').exists()
  analysis = json.loads((out / 'runs' / 'baseline_s0' / 'analysis' / 'report.json').read_text())
  assert analysis['step'] == 10
  text = results.read_text()
  assert text.startswith('# Results\n\nKept text.\n')
  assert text.count('<!-- experiment:tiny -->') == 1
  assert '## Tiny runner check' in text and 'Commit: `' in text and '| baseline | 1/1 |' in text
  assert not (out / figures.LONG_CONTEXT_FIGURE).exists()     # no LONG_CONTEXT in this experiment
  for name in figures.FIGURES:
    assert (results.parent / 'figures' / 'tiny' / name).is_file()


def test_finished_runs_are_skipped_and_interrupted_ones_resume(finished):
  path, out, results = finished
  train_log = out / 'runs' / 'baseline_s0' / 'train.log'
  size = train_log.stat().st_size
  # g1's analysis never finished: the rerun analyses it again without training it again.
  g1 = out / 'runs' / 'g1_elementwise_s0'
  state = json.loads((g1 / 'runner.json').read_text())
  (g1 / 'runner.json').write_text(json.dumps(dict(state, status='training')))
  (g1 / 'analysis' / 'report.json').unlink()
  g1_log = (g1 / 'train.log').stat().st_size
  cached = sorted(os.listdir(out / 'xla_cache'))
  assert run.main([str(path), '--out', str(out), '--results', str(results)]) == 0
  # The analysis again: every program it runs was compiled by the first one (read, not stored).
  assert sorted(os.listdir(out / 'xla_cache')) == cached
  assert train_log.stat().st_size == size and (g1 / 'train.log').stat().st_size == g1_log
  assert json.loads((g1 / 'runner.json').read_text())['status'] == 'done'
  assert (g1 / 'analysis' / 'report.json').is_file()
  assert results.read_text().count('<!-- experiment:tiny -->') == 1  # replaced, not appended


def test_reanalyze_runs_the_analysis_again_and_trains_nothing(finished, capsys):
  path, out, _ = finished
  base = out / 'runs' / 'baseline_s0'
  train_log = (base / 'train.log').stat().st_size
  report_json = base / 'analysis' / 'report.json'
  old = json.loads(report_json.read_text())
  report_json.write_text(json.dumps({k: v for k, v in old.items() if k != 'm_act_median'}))
  assert run.main([str(path), '--out', str(out), '--reanalyze', '--only', 'baseline_s0']) == 0
  assert 'baseline_s0: analysed again' in capsys.readouterr().out
  new = json.loads(report_json.read_text())
  assert new['m_act_median'] == old['m_act_median'] and new['loss'] == old['loss']
  assert (base / 'train.log').stat().st_size == train_log
  state = json.loads((base / 'runner.json').read_text())
  assert state['status'] == 'done' and 'reanalyzed' in state


def test_a_run_that_ends_spiking_is_analysed_at_its_last_calm_checkpoint(tmp_path, monkeypatch):
  """Trained to its last step but not saved there (the loss was not calm): resuming would
  replay the same spike, so the runner analyses the last calm checkpoint and the table says so."""
  from gated_attention.runs import rundir as runs_lib  # pylint: disable=g-import-not-at-top

  class Cfg:
    class train:  # noqa: N801
      steps = 10
  rows = [{'split': 'train', 'step': s} for s in (5, 10)]
  monkeypatch.setattr(runs_lib, 'read_config', lambda w: Cfg)
  monkeypatch.setattr(runs_lib, 'read_metrics', lambda w, **k: rows)
  monkeypatch.setattr(runs_lib, 'latest_step', lambda w: 5)
  assert running.ended_spiking('w') == 5
  monkeypatch.setattr(runs_lib, 'latest_step', lambda w: 10)   # the last step was saved
  assert running.ended_spiking('w') is None
  monkeypatch.setattr(runs_lib, 'latest_step', lambda w: 5)
  rows.pop()                                                    # stopped before the end
  assert running.ended_spiking('w') is None
  rows.append({'split': 'train', 'step': 10})

  path = tmp_path / 'tiny.py'
  path.write_text(EXPERIMENT)
  exp = spec.load(str(path), rundata.METRICS)
  calls = []
  monkeypatch.setattr(processes, 'call', lambda args, log: (calls.append(args[1]), (0, 2.0))[1])
  state = running.execute(exp, exp.runs[0], str(tmp_path / 'out'))
  assert calls == [exp.runs[0].train_args(exp.scale, '')[1], '--mode=analyze']
  assert state['status'] == 'done' and state['ended_spiking'] == 5
  res = rundata.Result(run=exp.runs[0], runner=state, report=None, rows=[])
  assert tables.runs_cell([res]) == '1/1 (1 ended spiking, analysed at step 5)'


def test_the_compilation_cache_is_not_part_of_what_a_run_trains(tmp_path):
  cmd = spec.shell(['main.py', '--config=configs/baseline.py:tiny', '--config.seed=1'], 'python')
  flag = ' --config.compilation_cache='
  assert running.same_command(cmd + flag + '/a', cmd + flag + '/b')
  assert running.same_command(cmd, cmd + flag + '/b')
  assert running.same_command(cmd, cmd + ' --analyze')      # the analysis in the training process
  assert not running.same_command(cmd, cmd.replace('seed=1', 'seed=2'))
  assert not running.same_command(None, cmd)
  assert running.cache_dir(str(tmp_path), '') == str(tmp_path / 'xla_cache')
  assert running.cache_dir(str(tmp_path), 'off') == ''
  assert running.cache_dir(str(tmp_path), 'c') == os.path.abspath('c')


def test_step_arithmetic_is_steps_times_the_median_step_time_after_the_compile():
  rows = [{'split': 'train', 'step': 5, 'step_time': 9.0},     # the compile's window
          {'split': 'val', 'step': 5, 'loss': 1.0},
          {'split': 'train', 'step': 10, 'step_time': 0.2},
          {'split': 'train', 'step': 15, 'step_time': 0.1},
          {'split': 'train', 'step': 20, 'step_time': 0.4}]
  assert rundata.step_arithmetic(rows) == pytest.approx(20 * 0.2)
  assert rundata.step_arithmetic(rows[:1]) == pytest.approx(5 * 9.0)
  assert rundata.step_arithmetic([]) == 0.0


def test_print_commands(finished, capsys):
  path, out, _ = finished
  assert run.main([str(path), '--out', str(out), '--print-commands']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and all(line.startswith(f'cd {spec.REPO} && python -m experiments.run')
                                 for line in lines)
  assert shlex.split(lines[1])[-2:] == ['--only', 'g1_elementwise_s0']
  assert run.main([str(path), '--out', str(out), '--print-commands=main', '--python=python3',
                   '--only=baseline_s0']) == 0
  (line,) = capsys.readouterr().out.splitlines()
  train, analyze = line.split(' && ')[1:]
  assert train.startswith('python3 main.py --config=configs/baseline.py:tiny --workdir=')
  assert '--config.seed=0' in train and '--config.data.source=synthetic' in train
  assert f'--config.compilation_cache={out / "xla_cache"}' in train
  assert analyze.startswith('python3 main.py --mode=analyze --workdir=')


def test_bad_experiment_files(tmp_path, capsys):
  bad = tmp_path / 'bad.py'
  bad.write_text("VARIANTS = ['nope']\n")
  assert run.main([str(bad)]) == 2
  assert 'configs/nope.py does not exist' in capsys.readouterr().err
  bad.write_text("VARIANTS = ['baseline']\nCOLUMNS = ['loss!']\n")
  assert run.main([str(bad)]) == 2
  assert "unknown COLUMNS ['loss!']" in capsys.readouterr().err
  ok = tmp_path / 'ok.py'
  ok.write_text("VARIANTS = ['baseline']\nSEEDS = [0, 1]\n"
                "GRID = {'train.learning_rate': [1e-3, 3e-3]}\n")
  exp = spec.load(str(ok), rundata.METRICS)
  assert [r.name for r in exp.runs][:2] == ['baseline_learning_rate=0.001_s0',
                                           'baseline_learning_rate=0.001_s1']
  assert exp.groups() == ['baseline_learning_rate=0.001', 'baseline_learning_rate=0.003']
  assert run.main([str(ok), '--only', 'nope_s0']) == 2
  assert 'no runs named' in capsys.readouterr().err


def test_mean_and_std_cells():
  assert tables.cell([1.0, 2.0, 3.0], '.2f') == '2.00 ± 1.00'
  assert tables.cell([1.0, 2.0, 3.0], '.2f', per_seed=True) == '2.00 ± 1.00 (1.00, 2.00, 3.00)'
  assert tables.cell([0.5, None], '.1f') == '0.5'
  assert tables.cell([[0.1, 0.9], [0.3, 0.7]], '.1f') == '0.2 / 0.8'
  assert tables.cell([None], '.1f') == '-'
  assert tables.cell([1.0, 0.0, None, 1.0], 'count') == '2/3'
  assert tables.cell([24800, 24800], '=,.0f') == '24,800'
  assert tables.cell([2.5e10, 2.6e10], '=.3g') == '2.5e+10 / 2.6e+10'
  assert tables.cell(['L0 ffn_out', 'L1 attn_out', 'L0 ffn_out'], 'mode') == (
      'L0 ffn_out (2/3), L1 attn_out (1/3)')


def test_sinks_counted_per_layer_with_wilson_intervals():
  """Issue 39 (3): a seed's sink is counted in each layer whose F-Attn reaches 0.3, and the
  formation rate gets its 95% Wilson interval (published values: 5/10 -> [0.237, 0.763],
  0/12 -> [0, 0.243], 12/12 -> [0.757, 1])."""
  for (k, n), (lo, hi) in {(5, 10): (0.2366, 0.7634), (0, 12): (0.0, 0.2425),
                           (12, 12): (0.7575, 1.0)}.items():
    assert stats.wilson_interval(k, n) == pytest.approx((lo, hi), abs=1e-4)
  reports = [{'f_attn': [0.9, 0.1]}, {'f_attn': [0.05, 0.35]}, {'f_attn': [0.29, 0.3]}]
  results = [rundata.Result(run=None, runner={}, report=r, rows=[]) for r in reports]
  per_layer = [rundata.METRICS['sink_layers'][1](r) for r in results]
  assert per_layer == [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
  assert tables.cell(per_layer, 'layer_count') == ('L0 1/3 [0.06, 0.79], '
                                                     'L1 2/3 [0.21, 0.94]')
  assert [rundata.METRICS['sink_layer'][1](r) for r in results] == ['L0', 'L1', 'L1']
  none = rundata.Result(run=None, runner={}, report={'f_attn': [0.1, 0.2]}, rows=[])
  assert rundata.METRICS['sink_layer'][1](none) == 'none'


def test_a_hybrids_f_attn_is_drawn_at_its_attention_layers():
  """A hybrid's report has F-Attn for its attention layers only (attention_layers: [3] for three
  DeltaNets then attention): the per-layer figure draws it at model layer 3, not at index 0, beside
  an all-attention group's four layers (M-Act stays per model layer)."""
  class Experiment:
    name = 'hybrid'
    def groups(self):
      return ['hybrid', 'attention']
  run = lambda group, seed: spec.Run(f'{group}_s{seed}', group, group, seed, ())  # noqa: E731
  hybrid = {'f_attn': [0.4], 'attention_layers': [3], 'seq_len': 128,
            'm_act': {'ffn_residual': [1.0, 2.0, 3.0, 4.0]}}
  attention = {'f_attn': [0.6, 0.1, 0.1, 0.2], 'attention_layers': [0, 1, 2, 3], 'seq_len': 128,
               'm_act': {'ffn_residual': [1.0, 2.0, 3.0, 4.0]}}
  results = [rundata.Result(run(g, s), {'status': 'done'}, dict(r), [])
             for g, r in (('hybrid', hybrid), ('attention', attention)) for s in (0, 1)]
  drawn = lambda fig: {line.get_label().split(' (')[0]: list(line.get_xdata())  # noqa: E731
                       for line in fig.axes[0].lines if '(n=' in line.get_label()}
  f_attn = drawn(figures.per_layer_figure(Experiment(), results, 'f_attn_layers', 'F-Attn'))
  assert f_attn == {'hybrid': [3], 'attention': [0, 1, 2, 3]}
  m_act = drawn(figures.per_layer_figure(Experiment(), results, 'm_act_layers', 'M-Act'))
  assert m_act == {'hybrid': [0, 1, 2, 3], 'attention': [0, 1, 2, 3]}


def _m_act_report(values, tokens, texts):
  """A report's m_act / m_act_where for 2 layers; values[site] = [layer 0, layer 1]."""
  return {'m_act': values,
          'm_act_where': {site: {'token': tokens[site], 'token_text': texts[site]}
                          for site in values}}


def test_m_act_origin_is_the_first_site_reaching_half_the_peak():
  sites = ('attn_out', 'attn_residual', 'ffn_out', 'ffn_residual')
  # Born in layer 0's FFN on BOS (600 >= 0.5 x 1000), carried by the residual stream.
  values = {'attn_out': [3.0, 5.0], 'attn_residual': [4.0, 610.0], 'ffn_out': [600.0, 20.0],
            'ffn_residual': [604.0, 1000.0]}
  tokens = {s: [0, 0] for s in sites}
  tokens['attn_out'] = [7, 9]
  texts = {s: ['<bos>' if t == 0 else 'x' for t in tokens[s]] for s in sites}
  o = rundata.m_act_origin(_m_act_report(values, tokens, texts))
  assert (o['layer'], o['site'], o['token'], o['token_text'], o['first_token']) == (
      0, 'ffn_out', 0, '<bos>', True)
  assert o['peak'] == 1000.0 and o['value'] == 600.0
  # A smaller value earlier no longer counts once the threshold is above it.
  o = rundata.m_act_origin(_m_act_report(values, tokens, texts), share=0.9)
  assert (o['layer'], o['site']) == (1, 'ffn_residual')
  values['attn_out'] = [900.0, 5.0]
  o = rundata.m_act_origin(_m_act_report(values, tokens, texts))
  assert (o['layer'], o['site'], o['token'], o['first_token']) == (0, 'attn_out', 7, False)
  res = rundata.Result(run=None, runner={}, report=_m_act_report(values, tokens, texts), rows=[])
  assert rundata.METRICS['m_act_origin'][1](res) == 'L0 attn_out'
  assert rundata.METRICS['m_act_bos'][1](res) is False
  assert rundata.m_act_origin({}) is None


def test_points_expand_into_groups_and_per_seed_must_be_a_column(tmp_path):
  path = tmp_path / 'points.py'
  path.write_text("VARIANTS = ['baseline', 'g1_elementwise']\nSEEDS = [0, 1]\n"
                  "OVERRIDES = {'model.num_heads': 1}\n"
                  "POINTS = [{}, {'model.num_heads': 2, 'model.head_dim': 64}]\n"
                  "GRID = {'train.learning_rate': [1e-3]}\n"
                  "COLUMNS = ['f_attn_max', 'sink_seeds']\nPER_SEED = ['f_attn_max']\n")
  exp = spec.load(str(path), rundata.METRICS)
  assert exp.groups() == [
      'baseline_learning_rate=0.001', 'baseline_num_heads=2_head_dim=64_learning_rate=0.001',
      'g1_elementwise_learning_rate=0.001',
      'g1_elementwise_num_heads=2_head_dim=64_learning_rate=0.001']
  assert len(exp.runs) == 8 and exp.per_seed == ('f_attn_max',)
  two = [r for r in exp.runs if r.group == 'baseline_num_heads=2_head_dim=64_learning_rate=0.001']
  assert dict(two[0].overrides) == {'model.num_heads': 2, 'model.head_dim': 64,
                                    'train.learning_rate': 1e-3}
  path.write_text("VARIANTS = ['baseline']\nCOLUMNS = ['val_loss']\nPER_SEED = ['f_attn_max']\n")
  with pytest.raises(spec.ExperimentError, match=r"PER_SEED names \['f_attn_max'\]"):
    spec.load(str(path), rundata.METRICS)
  path.write_text("VARIANTS = ['baseline']\nPOINTS = [{'a.b': 1}, {'a.b': 1}]\n")
  with pytest.raises(spec.ExperimentError, match='POINTS has a repeated point'):
    spec.load(str(path), rundata.METRICS)
  path.write_text("VARIANTS = ['baseline']\nPOINTS = {'a.b': 1}\n")
  with pytest.raises(spec.ExperimentError, match='POINTS must be a list of dicts'):
    spec.load(str(path), rundata.METRICS)


def test_commit_line_names_the_training_commits(monkeypatch):
  monkeypatch.setattr(processes, 'git_commit', lambda: 'abc1234')
  res = lambda c: rundata.Result(run=None, runner={'git_commit': c} if c else {}, report=None,
                                rows=[])
  assert sections.commits([res('abc1234'), res(None)]) == '`abc1234`'
  assert sections.commits([res('0d38440'), res('abc1234'), res('0d38440')]) == (
      '`abc1234` (runs trained at `0d38440`, `abc1234`)')


LONG_CONTEXT_EXPERIMENT = textwrap.dedent('''\
    """Tiny context extension check"""
    VARIANTS = ['g1_elementwise']
    OVERRIDES = {
        'data.seq_len': 32, 'data.val_batches': 1, 'model.num_layers': 1, 'train.steps': 4,
        'train.batch_size': 2, 'train.warmup_steps': 1, 'train.eval_every': 4,
        'train.checkpoint_every': 4,
    }
    EXTEND = 'seq_len=64,steps=2'
    LONG_CONTEXT = {'rope': {}, 'yarn': {'model.rope_scaling.type': 'yarn',
                                         'model.rope_scaling.factor': 2.0,
                                         'model.rope_scaling.original_max_len': 64}}
    LONG_CONTEXT_OVERRIDES = {'long_context.lengths': '32,128', 'long_context.docs': 1,
                              'long_context.tasks': 'niah_single', 'long_context.examples': 2,
                              'long_context.chunk': 64}
    ''')


def test_a_run_stopped_inside_the_long_context_stage_is_not_finished(tmp_path):
  """runner.json says 'long context' while the run is extended and evaluated; a run whose record
  says done (as the runner wrote before this stage had a status of its own) counts as finished
  only once every LONG_CONTEXT label has its report, so a stopped runner resumes the stage."""
  path = tmp_path / 'lc.py'
  path.write_text(LONG_CONTEXT_EXPERIMENT)
  experiment = spec.load(str(path), rundata.METRICS)
  (r,) = experiment.runs
  out = str(tmp_path / 'out')
  workdir = os.path.join(out, 'runs', r.name)
  os.makedirs(workdir)
  command = spec.shell(r.train_args(experiment.scale, workdir), 'python')
  os.makedirs(os.path.join(workdir, 'checkpoints', '4'))
  running.write_runner(workdir, {'status': 'long context', 'command': command})
  assert not running.finished(experiment, r, out)
  running.write_runner(workdir, {'status': 'done', 'command': command})
  assert not running.finished(experiment, r, out)
  evaluated = rundata.extended_dir(workdir)
  for i, label in enumerate(experiment.long_context):
    assert not running.finished(experiment, r, out)
    os.makedirs(os.path.join(evaluated, 'long_context', label))
    with open(os.path.join(evaluated, 'long_context', label, 'report.json'), 'w') as f:
      json.dump({'label': label}, f)
  assert i == 1 and running.finished(experiment, r, out)
  # More train.steps in the file than the run has (a runner stopped before training them).
  r8 = dataclasses.replace(
      r, overrides=tuple((k, 8 if k == 'train.steps' else v) for k, v in r.overrides))
  running.write_runner(workdir, {'status': 'done',
                              'command': spec.shell(r8.train_args(experiment.scale, workdir),
                                                    'python')})
  assert not running.finished(experiment, r8, out)


def test_an_extension_of_an_older_checkpoint_is_moved_aside_not_deleted(tmp_path):
  workdir = tmp_path / 'run'
  for step in ('3000', '6000'):
    (workdir / 'checkpoints' / step).mkdir(parents=True)
  extended = workdir / 'extended'
  (extended / 'checkpoints' / '750').mkdir(parents=True)
  (workdir / 'extend.log').write_text(
      f'$ python main.py ...\nInitialised from {workdir} (step 6000): parameters only, ...\n')
  running.set_aside_stale_extension(str(workdir), str(extended))  # from the latest: kept in place
  assert (extended / 'checkpoints' / '750').is_dir()
  (workdir / 'extend.log').write_text(
      f'$ python main.py ...\nInitialised from {workdir} (step 3000): parameters only, ...\n')
  running.set_aside_stale_extension(str(workdir), str(extended))
  aside = workdir / 'extended.from_step_3000'
  assert not extended.exists() and (aside / 'checkpoints' / '750').is_dir()
  assert '(step 3000)' in (aside / 'extend.log').read_text()
  assert not (workdir / 'extend.log').exists()


@pytest.mark.slow  # a runner in a subprocess, stopped mid-training (~40 s)
def test_sigterm_to_the_runner_stops_its_training_which_saves_and_resumes(tmp_path):
  """The commands run in processes forked from a server, outside the runner's process group:
  SIGTERM to the runner (a scheduler's limit, `kill`) reaches them through the runner, the
  training saves a checkpoint and stops, and nothing else starts (no process is left)."""
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  path, out = tmp_path / 'stop.py', tmp_path / 'out'
  path.write_text(EXPERIMENT.replace("'train.steps': 10", "'train.steps': 100000").replace(
      "'train.checkpoint_every': 10", "'train.checkpoint_every': 100000"))
  runner = subprocess.Popen([sys.executable, '-m', 'experiments.run', str(path), '--out',
                             str(out)], cwd=spec.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
  workdir = out / 'runs' / 'baseline_s0'
  deadline = time.time() + 300
  while time.time() < deadline and not ((workdir / 'metrics.jsonl').is_file()
                                        and (workdir / 'metrics.jsonl').stat().st_size):
    time.sleep(1)
  assert runner.poll() is None, runner.stdout.read()
  runner.send_signal(signal.SIGTERM)
  output, _ = runner.communicate(timeout=120)
  assert runner.returncode == 143, output
  assert 'Stopped by SIGTERM' in output
  steps = sorted(int(s) for s in os.listdir(workdir / 'checkpoints') if s.isdigit())
  assert steps and 0 < steps[-1] < 100000          # saved where it stopped
  assert json.loads((workdir / 'runner.json').read_text())['status'] == 'interrupted'
  assert not (out / 'runs' / 'g1_elementwise_s0').exists()  # nothing else started
  assert not (workdir / 'trainer.lock').exists()   # the trainer released the run and ended
  size = (workdir / 'metrics.jsonl').stat().st_size
  time.sleep(3)
  assert (workdir / 'metrics.jsonl').stat().st_size == size


@pytest.mark.slow  # five main.py processes (~1 min); the stages' parts have default tests
def test_extension_and_long_context_stages(tmp_path, capsys):
  """Train, analyse, extend (in <run>/extended) and evaluate twice; the tables and the figure;
  a rerun skips every stage; --print-commands=main chains the five commands."""
  path, out = tmp_path / 'lc.py', tmp_path / 'out'
  path.write_text(LONG_CONTEXT_EXPERIMENT)
  assert run.main([str(path), '--out', str(out)]) == 0
  workdir = out / 'runs' / 'g1_elementwise_s0'
  state = json.loads((workdir / 'runner.json').read_text())
  assert state['status'] == 'done' and state['extend_seconds'] > 0
  assert state['long_context_seconds'] > 0 and 'extend_context.py:' in state['extend_command']
  for label in ('rope', 'yarn'):
    rep = json.loads((workdir / 'extended' / 'long_context' / label / 'report.json').read_text())
    assert rep['train_seq_len'] == 64 and rep['lengths'] == [32, 128]
  text = (out / 'results.md').read_text()
  assert 'Long context, `rope` (rope1e+06;' in text
  assert 'Long context, `yarn` (rope1e+06_yarn2x64;' in text
  rope_table = text.split('Long context, `rope`')[1].split('Long context, `yarn`')[0]
  row = next(l for l in rope_table.splitlines() if l.startswith('| g1_elementwise | 1/1 | '))
  cells = row.split(' | ')
  assert float(cells[2]) > 0 and float(cells[3]) > 0 and cells[4] == '-'  # niah needs 81 tokens
  assert 0 <= float(cells[5].rstrip(' |')) <= 100
  assert (out / figures.LONG_CONTEXT_FIGURE).stat().st_size > 0
  logs = {name: (workdir / name).stat().st_size for name in ('extend.log', 'long_context.log')}
  capsys.readouterr()
  assert run.main([str(path), '--out', str(out)]) == 0       # everything done: nothing reruns
  assert {name: (workdir / name).stat().st_size for name in logs} == logs
  # Stopped inside the stage (one label's report missing): the rerun evaluates that label only.
  shutil.rmtree(workdir / 'extended' / 'long_context' / 'yarn')
  extend_log = (workdir / 'extend.log').stat().st_size
  assert run.main([str(path), '--out', str(out)]) == 0
  assert (workdir / 'extend.log').stat().st_size == extend_log
  assert (workdir / 'long_context.log').stat().st_size > logs['long_context.log']
  assert rundata.read_long_context(str(workdir / 'extended'), 'yarn')['train_seq_len'] == 64
  assert json.loads((workdir / 'runner.json').read_text())['status'] == 'done'
  # More steps in the experiment file: the run trains on from its checkpoint (its recorded
  # command differs), and the extension of the older model is moved aside, kept, and redone.
  path.write_text(LONG_CONTEXT_EXPERIMENT.replace("'train.steps': 4", "'train.steps': 8"))
  train_log = (workdir / 'train.log').stat().st_size
  assert run.main([str(path), '--out', str(out)]) == 0
  assert (workdir / 'train.log').stat().st_size > train_log
  assert sorted(os.listdir(workdir / 'checkpoints'))[-1] == '8'
  assert 'Initialised from' in (workdir / 'extended.from_step_4' / 'extend.log').read_text()
  assert '(step 8)' in (workdir / 'extend.log').read_text()
  assert rundata.read_long_context(str(workdir / 'extended'), 'yarn') is not None
  assert (workdir / 'extended.from_step_4' / 'long_context' / 'rope' / 'report.json').is_file()
  path.write_text(LONG_CONTEXT_EXPERIMENT)
  capsys.readouterr()
  assert run.main([str(path), '--out', str(out), '--print-commands=main']) == 0
  (line,) = capsys.readouterr().out.splitlines()
  assert line.count(' && ') == 5 and line.count('--mode=long_context') == 2


@pytest.mark.parametrize('name', sorted(f[:-3] for f in os.listdir(spec.REPO + '/experiments')
                                        if f.endswith('.py') and f not in
                                        ('__init__.py', 'run.py', 'spec.py', 'scaling.py',
                                         'rundata.py', 'tables.py', 'stability.py', 'figures.py',
                                         'sections.py', 'processes.py', 'running.py',
                                         'stats.py', 'paired.py', 'divergence.py', 'inference.py')))
def test_committed_experiment_files_load_and_name_real_config_fields(name):
  """Each experiments/<name>.py loads, and every override names a field of its variants' configs
  (a typo would otherwise fail its first run after minutes of training)."""
  import importlib  # pylint: disable=g-import-not-at-top
  exp = spec.load(os.path.join(spec.REPO, 'experiments', f'{name}.py'), rundata.METRICS)
  extra = {**exp.analyze_overrides, **exp.long_context_overrides,
           **{k: v for lc in exp.long_context.values() for k, v in lc.items()}}
  for r in exp.runs:
    cfg = importlib.import_module(f'configs.{r.variant}').get_config(exp.scale)
    for key in [k for k, _ in r.overrides] + list(extra):
      node = cfg
      for part in key.split('.'):
        assert part in node, f'{name}: {key} is not a config field of {r.variant}'
        node = node[part]


SEEDS_EXPERIMENT = EXPERIMENT.replace("VARIANTS = ['baseline', 'g1_elementwise']",
                                      "VARIANTS = ['g1_elementwise']").replace(
                                          'SEEDS = [0]', 'SEEDS = [0, 1]')


def test_a_groups_seeds_are_one_unit_unless_batching_is_off(tmp_path):
  path = tmp_path / 'seeds.py'
  path.write_text(SEEDS_EXPERIMENT)
  experiment = spec.load(str(path), rundata.METRICS)
  out = str(tmp_path / 'out')
  (unit,) = running.units(experiment, experiment.runs, out, True)
  assert [r.name for r in unit] == ['g1_elementwise_s0', 'g1_elementwise_s1']
  assert [len(u) for u in running.units(experiment, experiment.runs, out, False)] == [1, 1]
  assert [len(u) for u in running.units(experiment, experiment.runs[:1], out, True)] == [1]
  args = spec.seeds_train_args(unit, 'tiny', os.path.join(out, 'runs', 'g1_elementwise_s{seed}'))
  single = unit[0].train_args('tiny', os.path.join(out, 'runs', 'g1_elementwise_s0'))
  assert '--seeds=0,1' in args and not any(a.startswith('--config.seed=') for a in args)
  assert args[4:] == single[4:]                # the same overrides as each seed's single run
  os.makedirs(os.path.join(out, 'runs', 'g1_elementwise_s1', 'checkpoints', '5'))
  assert [len(u) for u in running.units(experiment, experiment.runs, out, True)] == [1, 1]


@pytest.mark.slow  # one batched training and two analyses in subprocesses (~40 s)
def test_seeds_of_a_group_train_as_one_program(tmp_path):
  path, out = tmp_path / 'seeds.py', tmp_path / 'out'
  path.write_text(SEEDS_EXPERIMENT)
  assert run.main([str(path), '--out', str(out), '--batch-seeds']) == 0
  log = out / 'runs' / 'g1_elementwise.seeds.log'
  assert '--seeds=0,1' in log.read_text()
  for seed in (0, 1):
    workdir = out / 'runs' / f'g1_elementwise_s{seed}'
    state = json.loads((workdir / 'runner.json').read_text())
    assert state['status'] == 'done' and state['seeds_exit'] == 0
    assert f'--config.seed={seed}' in state['command'] and '--seeds=0,1' in state['seeds_command']
    assert state['train_seconds'] == pytest.approx(state['seeds_seconds'] / 2)
    assert not (workdir / 'train.log').exists()   # trained in the batch, not alone
    assert (workdir / 'analysis' / 'report.json').is_file()
    assert json.loads((workdir / 'config.json').read_text())['seed'] == seed
  size = log.stat().st_size
  assert run.main([str(path), '--out', str(out), '--batch-seeds']) == 0   # done: not again
  assert log.stat().st_size == size


def test_long_context_tables_name_a_synthetic_retrieval_task(tmp_path):
  """A synthetic run's long-context reports (mqar accuracy in the RULER shape): the table's
  columns are named after the task and hold the mean over seeds of its accuracy in % and each
  seed's value."""
  path = tmp_path / 'lc.py'
  path.write_text(LONG_CONTEXT_EXPERIMENT.replace("VARIANTS = ['g1_elementwise']",
                                                  "VARIANTS = ['g1_elementwise']\nSEEDS = [0, 1]"))
  exp = spec.load(str(path), rundata.METRICS)

  def rep(acc):
    return {'lengths': [32, 128], 'rope_tag': 'rope1e+06', 'step': 2, 'train_seq_len': 64,
            'examples_per_cell': 8,
            'loss': {'buckets': [{'from': 0, 'to': 32, 'loss': 1.0},
                                 {'from': 32, 'to': 128, 'loss': 2.0}],
                     'curve': {'position': [0, 64], 'loss': [1.0, 2.0]}},
            'ruler': {'mqar': {'32': acc, '128': acc / 2}},
            'retrieval': {'task': 'mqar', 'documents': 8, 'lengths': {}}}

  results = [rundata.Result(r, {'status': 'done'}, None, [], {'rope': rep(a), 'yarn': rep(a)})
             for r, a in zip(exp.runs, (0.5, 0.7))]
  text = tables.long_context_tables(exp, results)
  assert 'mqar: % of the answers exact (teacher-forced greedy), 8 held-out documents' in text
  assert '| run | seeds | loss 0-32 | loss 32-128 | mqar 32 | mqar 128 |' in text
  row = next(l for l in text.splitlines() if l.startswith('| g1_elementwise | 2/2 | '))
  assert row.split(' | ')[4:] == ['60 ± 14 (50, 70)', '30 ± 7 (25, 35) |']
  assert figures.long_context_figure(exp, results) is not None


def _fisher_two_sided(a: int, n1: int, c: int, n2: int) -> float:
  """Fisher's exact test from its definition: the hypergeometric probability of every table with
  the same margins, summed over those no more likely than the observed one."""
  from math import comb  # pylint: disable=g-import-not-at-top
  k, n = a + c, n1 + n2
  prob = [comb(n1, x) * comb(n2, k - x) / comb(n, k)
          for x in range(max(0, k - n2), min(k, n1) + 1)]
  observed = comb(n1, a) * comb(n2, c) / comb(n, k)
  return float(sum(q for q in prob if q <= observed * (1 + 1e-9)))


def test_formation_counted_with_interval_first_step_and_fisher(tmp_path):
  """Issue 39 (1): FORMED_BELOW counts the runs whose final validation loss is below it, per
  group, with the rate's Wilson interval, each seed's first evaluation below it, and Fisher's
  exact test against the first group (here against its definition, on the counts of
  retrieval_table5: 4/6 against 1/6, p = 0.242); the long-context tables add a row over the
  formed runs alone."""
  path = tmp_path / 'formed.py'
  path.write_text(LONG_CONTEXT_EXPERIMENT.replace(
      "VARIANTS = ['g1_elementwise']",
      "VARIANTS = ['baseline', 'g1_elementwise']\nSEEDS = [0, 1, 2, 3, 4, 5]\n"
      "FORMED_BELOW = 1.17"))
  exp = spec.load(str(path), rundata.METRICS)
  assert exp.formed_below == 1.17
  rng = np.random.default_rng(0)
  finals = {'baseline': [1.30, 1.04, 1.05, 1.10, 1.16, 1.29],
            'g1_elementwise': [1.29, 1.19, 1.21, 1.30, 1.04, 1.28]}

  def rows(final):   # validation every 500 steps, falling to `final` by step 3,000
    losses = np.maximum(np.linspace(1.9, final, 6) + rng.uniform(0, 0.01, 6), final)
    return [{'split': 'train', 'step': 10 * i, 'loss': 0.5} for i in range(3)] + [
        {'split': 'val', 'step': 500 * (i + 1), 'loss': float(v)} for i, v in enumerate(losses)]

  def rep(acc):
    return {'lengths': [32], 'rope_tag': 'rope1e+06', 'step': 2, 'train_seq_len': 64,
            'examples_per_cell': 8,
            'loss': {'buckets': [{'from': 0, 'to': 32, 'loss': 1.0}],
                     'curve': {'position': [0, 32], 'loss': [1.0, 1.0]}},
            'ruler': {'mqar': {'32': acc}}, 'retrieval': {'task': 'mqar'}}

  results = []
  for r in exp.runs:
    final = finals[r.variant][r.seed]
    rs = rows(final)
    results.append(rundata.Result(r, {'status': 'done'}, {'loss': final}, rs,
                                 {'rope': rep(0.9 if final < 1.17 else 0.5)}))
    want = next((x['step'] for x in rs if x['split'] == 'val' and x['loss'] < 1.17), None)
    assert rundata.formed_at(rs, 1.17) == want
  assert rundata.formed_at([{'split': 'train', 'step': 5, 'loss': 0.1}], 1.17) is None
  counts = tables.formation_counts(exp, results)
  assert counts['baseline']['formed'] == 4 and counts['baseline']['seeds'] == [1, 2, 3, 4]
  assert counts['g1_elementwise']['seeds'] == [4] and counts['baseline']['fisher_p'] is None
  assert counts['g1_elementwise']['fisher_p'] == pytest.approx(_fisher_two_sided(4, 6, 1, 6))
  assert counts['g1_elementwise']['fisher_p'] == pytest.approx(0.2424, abs=1e-4)
  assert counts['g1_elementwise']['interval'] == pytest.approx(stats.wilson_interval(1, 6))
  assert counts['baseline']['formed_at']['0'] is None
  assert counts['baseline']['formed_at']['4'] == 3000  # only its last evaluation is below
  for a, n1, c, n2 in [(0, 6, 6, 6), (3, 16, 9, 16), (5, 7, 1, 12)]:  # the definition, again
    groups = {'baseline': [1.0] * a + [1.3] * (n1 - a),
              'g1_elementwise': [1.0] * c + [1.3] * (n2 - c)}
    fake = [rundata.Result(spec.Run(f'{g}_s{i}', g, g, i, ()), {'status': 'done'}, {'loss': v}, [])
            for g, vs in groups.items() for i, v in enumerate(vs)]
    assert tables.formation_counts(exp, fake)['g1_elementwise']['fisher_p'] == pytest.approx(
        _fisher_two_sided(a, n1, c, n2))
  text = tables.formation(exp, results)
  assert '| g1_elementwise | 1/6 | [0.03, 0.56] | s0 -, s1 -, s2 -, s3 -, s4 ' in text
  text = tables.long_context_tables(exp, results)
  assert ('| baseline, formed (s1, s2, s3, s4) | 4/4 | 1.000 ± 0.000 | 90 ± 0 (90, 90, 90, 90) |'
          in text)
  assert '| g1_elementwise, formed (s4) | 1/1 | 1.000 | 90.0 |' in text
  fig = figures.long_context_figure(exp, results)     # the formed runs alone
  assert [line.get_label() for line in fig.axes[0].lines if not line.get_label().startswith('_')
          ] == ['baseline, formed (n=4)', 'g1_elementwise, formed (n=1)']
  for bad in ('0', "'1.2'", 'True', '-1.0'):
    path.write_text(LONG_CONTEXT_EXPERIMENT + f'FORMED_BELOW = {bad}\n')
    with pytest.raises(spec.ExperimentError, match='FORMED_BELOW must be a positive'):
      spec.load(str(path), rundata.METRICS)


def test_stability_counts_failures_per_rate_with_interval_fisher_and_largest_stable(tmp_path):
  """Issue 49 (2): STABILITY counts, per variant and learning rate, the runs that failed to
  train (halted by the guard, or a final validation loss above DIVERGED_ABOVE), with the rate's
  Wilson interval, Fisher's exact test against the baseline at the same rate (here against its
  definition), each run's spike steps from its rows (a halted run's too) and the final loss of
  the runs that trained; and per variant the largest rate at which every seed trained."""
  path = tmp_path / 'stab.py'
  path.write_text(EXPERIMENT.replace('SEEDS = [0]', 'SEEDS = [0, 1, 2, 3, 4]') +
                  "GRID = {'train.learning_rate': [0.01, 0.03, 0.1]}\nSTABILITY = True\n"
                  'DIVERGED_ABOVE = 3.0\n')
  exp = spec.load(str(path), rundata.METRICS)
  assert exp.stability and exp.diverged_above == 3.0
  # per (variant, rate): each seed's outcome: 'h' halted, a loss (> 3.0: collapsed)
  outcomes = {('baseline', 0.01): [2.1, 2.2, 2.0, 2.1, 2.3],
              ('baseline', 0.03): [2.4, 'h', 3.4, 'h', 2.5],
              ('baseline', 0.1): ['h', 'h', 'h', 3.5, 'h'],
              ('g1_elementwise', 0.01): [2.0, 2.1, 1.9, 2.0, 2.2],
              ('g1_elementwise', 0.03): [2.2, 2.3, 2.1, 2.2, 2.4],
              ('g1_elementwise', 0.1): [2.9, 'h', 2.8, 3.1, 2.7]}
  results = []
  for r in exp.runs:
    o = outcomes[(r.variant, dict(r.overrides)['train.learning_rate'])][r.seed]
    spikes = [{'split': 'spike', 'step': 10 + i} for i in range(r.seed)]  # seed s: s spikes
    rows = [{'split': 'train', 'step': 5, 'loss': 3.0}] + spikes
    if o == 'h':
      results.append(rundata.Result(r, {'status': 'diverged'}, None, rows + [
          {'split': 'failure', 'step': 99}]))
    else:
      results.append(rundata.Result(r, {'status': 'done'}, {'loss': o}, rows))
  results[0] = rundata.Result(results[0].run, {'status': 'training'}, None, [])  # unfinished
  counts = stability.failures(exp, results)
  b3, g3 = counts['baseline_learning_rate=0.03'], counts['g1_elementwise_learning_rate=0.03']
  assert (b3['diverged'], b3['runs'], b3['halted'], b3['collapsed']) == (3, 5, 2, 1)
  assert b3['seeds'] == [1, 2, 3] and b3['fisher_p'] is None
  assert b3['interval'] == pytest.approx(stats.wilson_interval(3, 5))
  assert b3['spikes'] == {'0': 0, '1': 1, '2': 2, '3': 3, '4': 4}
  assert b3['trained_loss'] == {'0': 2.4, '4': 2.5}
  assert g3['fisher_p'] == pytest.approx(_fisher_two_sided(3, 5, 0, 5))
  g10 = counts['g1_elementwise_learning_rate=0.1']
  assert (g10['diverged'], g10['runs']) == (2, 5)
  assert g10['fisher_p'] == pytest.approx(_fisher_two_sided(5, 5, 2, 5))
  assert g10['fisher_p'] == pytest.approx(0.1667, abs=1e-4)
  b1 = counts['baseline_learning_rate=0.01']
  assert (b1['diverged'], b1['runs']) == (0, 4)   # the unfinished seed is not counted
  assert counts['g1_elementwise_learning_rate=0.01']['fisher_p'] == pytest.approx(1.0)
  assert stability.largest_stable(counts) == {
      'baseline': {'largest': 0.01, 'first_failure': 0.03, 'monotone': True},
      'g1_elementwise': {'largest': 0.03, 'first_failure': 0.1, 'monotone': True}}
  text = stability.table(exp, results)
  assert ('| baseline_learning_rate=0.03 | 3/5 | 2, 1 | [0.23, 0.88] | - | 2.0 ± 1.6 (s0 0, '
          's1 1, s2 2, s3 3, s4 4) | 2.450 ± 0.071 (s0 2.400, s4 2.500) | - |') in text
  # the paired gap over the seeds at which both trained (0 and 4 at 0.03): 0.2 and 0.1; the
  # 95% t interval 0.15 ± 12.706 * 0.05
  gap = g3['gap']
  assert (gap['n'], gap['lower']) == (2, 2) and gap['mean'] == pytest.approx(0.15)
  assert gap['interval'] == pytest.approx([0.15 - 12.7062 * 0.05, 0.15 + 12.7062 * 0.05],
                                          abs=1e-3)
  assert '| +0.150 [-0.485, +0.785] (2/2 lower) |' in text
  assert b3['gap'] is None and g10['gap'] is None   # the baseline trained on no seed at 0.1
  g1 = counts['g1_elementwise_learning_rate=0.01']['gap']   # seed 0 of the baseline unfinished
  assert (g1['n'], g1['lower']) == (4, 4) and g1['mean'] == pytest.approx(0.1)
  assert stability.paired_gap({'0': 2.0}, {'0': 1.5, '1': 1.0}) == {
      'mean': 0.5, 'interval': None, 'n': 1, 'lower': 1}
  assert '| g1_elementwise | 0.03 | 0.1 |' in text
  fig = stability.figure(exp, results)
  failed, loss = fig.axes[:2]
  assert [l.get_label() for l in failed.lines if not l.get_label().startswith('_')] == []  # errorbars
  assert [c.get_label() for c in failed.containers] == ['baseline', 'g1_elementwise']
  base_rate = failed.containers[0].lines[0].get_ydata()
  assert list(base_rate) == pytest.approx([0.0, 0.6, 1.0])
  assert 'stability.png' in sections.figure_names(exp)
  # without DIVERGED_ABOVE only the guard's halts count
  path.write_text(path.read_text().replace('DIVERGED_ABOVE = 3.0\n', ''))
  exp = spec.load(str(path), rundata.METRICS)
  assert stability.failures(exp, results)['baseline_learning_rate=0.03']['diverged'] == 2
  for bad, match in (('STABILITY = False\nDIVERGED_ABOVE = 3.0', 'only with STABILITY'),
                     ('DIVERGED_ABOVE = -1', 'DIVERGED_ABOVE must be a positive')):
    path.write_text(EXPERIMENT + bad + '\n' + ('STABILITY = True\n' if '-1' in bad else ''))
    with pytest.raises(spec.ExperimentError, match=match):
      spec.load(str(path), rundata.METRICS)


def test_scaling_fits_against_independent_least_squares():
  """Issue 39 (2): experiments/scaling.py's power law, bootstrap and gap trend against float64
  least squares written out here (np.linalg.lstsq), on random data."""
  from experiments import scaling  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  sizes = [2.5e4, 1e5, 3.2e5, 7.9e5]
  x = np.repeat(sizes, 3)
  y = 4.0 * x ** -0.11 * np.exp(rng.normal(0, 0.01, x.size))
  design = np.stack([np.ones_like(x), np.log(x)], axis=1)
  (c0, c1), *_ = np.linalg.lstsq(design, np.log(y), rcond=None)
  a, alpha = scaling.fit_power_law(x, y)
  assert (a, alpha) == pytest.approx((np.exp(c0), -c1), rel=1e-9)
  assert alpha == pytest.approx(0.11, abs=0.02)
  points = {s: list(y[x == s]) for s in sizes}
  lo, hi = scaling.bootstrap_alpha(points)
  assert lo < alpha < hi and hi - lo < 0.05
  # the gap trend: least squares of every seed's gap on log10 N, with the residuals' error
  per_seed = rng.normal(0.01, 0.01, (4, 3)) + 0.004 * np.log10(sizes)[:, None]
  rows = [{'variant': 'g', 'params': n, 'per_seed': list(d)} for n, d in zip(sizes, per_seed)]
  xs = np.repeat(np.log10(sizes), 3)
  design = np.stack([np.ones(12), xs], axis=1)
  coef, rss, *_ = np.linalg.lstsq(design, per_seed.reshape(-1), rcond=None)
  cov = rss[0] / (12 - 2) * np.linalg.inv(design.T @ design)
  assert scaling.gap_trend(rows, 'g') == pytest.approx((coef[1], np.sqrt(cov[1, 1])), rel=1e-9)


def test_scaling_tables_and_sizes_of_a_run(tmp_path):
  """The sizes come from the saved config (param_report's non-embedding count; FLOPs per token x
  tokens); the tables pair each size's baseline and gated runs."""
  from configs import baseline  # pylint: disable=g-import-not-at-top
  from experiments import scaling  # pylint: disable=g-import-not-at-top
  c = baseline.get_config('tiny')
  c.update_from_flattened_dict({'model.num_layers': 2, 'model.hidden_size': 32,
                                'model.num_heads': 2, 'model.num_kv_heads': 1,
                                'model.head_dim': 16, 'model.ffn_size': 96, 'train.steps': 10,
                                'train.batch_size': 4, 'data.seq_len': 16})
  size = scaling.run_size(c)
  per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 96 + 2 * 32 + 2 * 16  # + norms
  assert size['params'] == 2 * per_layer + 32   # the final norm
  assert size['tokens'] == 10 * 4 * 16
  run = lambda v, n, s, loss: rundata.Result(  # noqa: E731
      run=spec.Run(f'{v}_{n}_s{s}', f'{v}_{n}', v, s, ()), runner={'status': 'done'},
      report={'loss': loss}, rows=[], size={'params': n, 'flops': 6.0 * n * 1000})
  results = [run(v, n, s, 3.0 * n ** -0.1 - (0.01 if v == 'g1' else 0) + 0.001 * s)
             for v in ('baseline', 'g1') for n in (1e4, 1e5, 1e6) for s in range(3)]
  text = scaling.tables(results)
  assert '| baseline | 0.0999 | [0.09' in text and '| g1 | 0.1010 |' in text
  assert '| 100,000 | g1 | +0.0100 |' in text
  assert text.count('| g1 | +0.0100 |') == 3
  scaling.figure(results)


def test_every_experiment_file_in_the_repository_loads():
  """Each experiments/*.py that defines VARIANTS (an experiment, not a module of the runner)
  passes spec.load's checks: its variants are configs, its override keys are config fields, its
  seeds, columns and cutoffs are well formed."""
  folder = os.path.join(REPO_ROOT, 'experiments')
  paths = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith('.py'))
  experiments = [p for p in paths if '\nVARIANTS' in _read(p)]
  assert len(experiments) >= 25, experiments
  for path in experiments:
    exp = spec.load(path, rundata.METRICS)
    assert exp.runs and exp.title, path


def test_every_experiment_file_the_docs_name_exists():
  """Every `experiments/<name>.py` that README.md, a guide in docs/ or a file in experiments/
  names exists: a reader can run what the text points at (lr_stability_bf16.py's docstring, and
  with it its results.md section, once named a boundary file that did not exist)."""
  texts = [os.path.join(REPO_ROOT, 'README.md')]
  for folder in ('docs', 'experiments'):
    texts += [os.path.join(REPO_ROOT, folder, n) for n in os.listdir(os.path.join(REPO_ROOT, folder))
              if n.endswith(('.md', '.py'))]
  named = {m for t in texts for m in re.findall(r'experiments/[A-Za-z0-9_]+\.py', _read(t))}
  assert 'experiments/lr_stability_bf16_boundary.py' in named   # the check sees a named file
  missing = sorted(m for m in named if not os.path.isfile(os.path.join(REPO_ROOT, m)))
  assert not missing, missing


def _read(path: str) -> str:
  with open(path, encoding='utf-8') as f:
    return f.read()
