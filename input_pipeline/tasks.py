"""The synthetic tasks by name (`data.task`): a spec to its task, one of synthetic.py's bigram
families or mqar.py's associative recall, which builds on them (so the choice sits above both).
"""

from gated_attention.input_pipeline import mqar
from gated_attention.input_pipeline import synthetic


def task_of(spec: synthetic.TaskSpec) -> synthetic.SyntheticTask:
  """The task of a checked spec (e.g. one with another doc_len: dataclasses.replace)."""
  spec.check()
  if spec.name == 'mqar':
    return mqar.MQARTask(spec)
  return synthetic.SyntheticTask(spec)


def make_task(data_cfg) -> synthetic.SyntheticTask:
  """The task of `data.task` / `data.synthetic`; raises DataError for bad settings."""
  return task_of(synthetic.TaskSpec.from_config(data_cfg))
