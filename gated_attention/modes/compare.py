"""--mode=compare RUN1 RUN2 ...: the paper's table and side-by-side figures for several runs
(analysis/compare.py), written into --out (default compare/)."""

import os
import sys

from gated_attention.analysis import compare as compare_lib
from gated_attention.runs import rundir


def compare(run_dirs: list[str], out_dir: str) -> str:
  """Reads each run directory (config, metrics, analysis report) and writes the comparison;
  returns the markdown."""
  summaries = []
  for workdir in run_dirs:
    config = rundir.read_config(workdir)
    summaries.append(compare_lib.run_summary(
        workdir, config.get('variant', os.path.basename(workdir)), rundir.read_metrics(workdir),
        rundir.read_report(workdir), rundir.read_goodput(workdir)))
  return compare_lib.compare(summaries, out_dir)


def main(args):
  if not args.runs:
    sys.exit('--mode=compare needs run directories: main.py --mode=compare RUN1 RUN2 ...')
  print(compare(list(args.runs), args.out or 'compare'))
