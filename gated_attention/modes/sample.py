"""--mode=sample: continues text prompts with a run's checkpoint (inference/generate.py).

  python main.py --mode=sample --workdir=runs/g1 --prompt="The cat" --max_new_tokens=100
  python main.py --mode=sample --workdir=runs/g1 --prompt="The cat" --max_new_tokens=5000 \
      --window=256 --sinks=4      # a sliding-window cache (model/kv_cache.py): flat memory
"""

import time

from gated_attention.inference import generate
from gated_attention.model import kv_cache
from gated_attention.runs import rundir


def sample(workdir: str, prompts: list[str], *, max_new_tokens: int, temperature: float = 0.0,
           top_p: float = 1.0, seed: int = 0, overrides: dict | None = None,
           step: int | None = None, window: int = 0, sinks: int = 0) -> list[str]:
  """Continues each text prompt with the run's checkpoint `step` (default latest); prints and
  returns the continuations. `overrides`: --config.X overrides of the saved config that
  evaluation allows (rundir.evaluation_config), e.g. YaRN for longer contexts. `window` > 0:
  a sliding-window cache of the last `window` tokens and the first `sinks` (kv_cache.py)."""
  cache_window = kv_cache.Window.from_settings(window, sinks, names=('--window', '--sinks'))
  if not prompts:
    raise generate.GenerateError('--mode=sample needs at least one --prompt="...".')
  if max_new_tokens < 1:
    raise generate.GenerateError(f'--max_new_tokens={max_new_tokens} must be at least 1.')
  config = rundir.eval_config(workdir, overrides, generation=True)
  rundir.check_tokenizer(workdir, config, '--mode=sample')
  run = rundir.load_run(workdir, step, config=config)
  tok = run.tokenizer
  ids = [[int(i) for i in tok.encode_doc(p)] for p in prompts]
  gen = generate.Generator(run.model, max_len=max(map(len, ids)) + max_new_tokens,
                           window=cache_window)
  t0 = time.time()
  out = gen.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                     eos_id=tok.bos_id, seed=seed)
  seconds = time.time() - t0
  texts = [tok.decode(t) for t in out.tokens]
  for prompt, text, done in zip(prompts, texts, out.finished):
    print(f'--- {prompt!r} ->{" (stopped at end of document)" if done else ""}\n{prompt}{text}')
  print(f'--- {run.config.get("variant", "")} step {run.step}: {out.new_tokens} new tokens for '
        f'{len(prompts)} prompt(s) in {seconds:.1f}s, compilation included '
        f'(temperature {temperature}, top_p {top_p}, seed {seed}'
        + ('' if cache_window is None else
           f'; sliding-window cache of {gen.window.window} + {gen.window.sinks} sink tokens')
        + ').', flush=True)
  return texts


def main(args):
  sample(args.workdir, list(args.prompts), max_new_tokens=args.max_new_tokens,
         temperature=args.temperature, top_p=args.top_p, seed=args.sample_seed,
         overrides=args.overrides, step=args.step, window=args.window, sinks=args.sinks)
