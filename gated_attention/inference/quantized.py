"""A checkpoint's held-out loss under simulated quantization, and the outliers that explain it
(`--mode=quantization`).

    python main.py --mode=quantization --workdir=runs/g1
    python main.py --mode=quantization --workdir=runs/g1 --config.quantization.group_size=32 \\
        --config.quantization.settings=w8a16,w4a16,w16a8,w8a8,w4a8

Settings (model/quantization.py has the grids and what is quantized):
  w8a16   weights int8 per output channel, activations left in the compute dtype
  w4a16   weights int4 per group of quantization.group_size inputs, activations left
  w8a8    weights int8 per channel, and the input of every linear int8 (dynamic)
  w4a8    weights int4 group-wise, the inputs int8
  w16a8   the inputs int8 alone (weights float: the activations' share of the loss)
  w4a4, w16a4   the same with int4 inputs (symmetric [-7, 7], dynamic): beyond the issue's four,
          where small models' int8 shows nothing (the 2026 sink papers report W4A4)
Settings with quantized activations are evaluated once per granularity of
quantization.activations (per tensor, per token). The loss is the mean token cross-entropy over the same held-out batches
as the float model (quantization.num_batches of quantization.batch_size sequences of
data.seq_len tokens; 0: data.val_batches and train.batch_size), and each setting reports its
increase over the float model. Beside it, per layer and linear input (the attention's input X,
W_O's input, the FFN's input and its down projection's input), the float model's max |x| and the
pooled kurtosis of x over those batches: activation outliers, the massive activations that
make per-tensor int8 lose precision (Bondarenko et al. 2023, "Quantizable Transformers"; the
gate is their remedy, Qiu et al. 2025 Sec. 4.3 find it removes the massive activations).
Writes RUN/quantization/ (report.json, quantization.md; --out=DIR for a read-only run).

Simulated: every number stays a float on the grid (fake quantization); what a real int8 kernel
adds (speed, memory) is docs/inference.md's note and benchmarks/int8_matmul.py's measurement.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.errors import ConfigError
from gated_attention.model import quantization

SETTINGS = {   # name -> (weight bits or None, activation bits or None)
    'w8a16': (8, None), 'w4a16': (4, None), 'w8a8': (8, 8), 'w4a8': (4, 8), 'w16a8': (None, 8),
    'w4a4': (4, 4), 'w16a4': (None, 4)}
DEFAULT_SETTINGS = 'w8a16,w4a16,w8a8,w4a8'
LOSS_CHUNK = 512   # tokens of float32 logits [batch, chunk, vocab] alive at a time


def parse(settings: str, activations: str, group_size: int) -> list[dict]:
  """The evaluated settings, in order: {'key', 'name', 'weight_bits', 'group', 'per',
  'weights', 'activations'}; a bad name is refused naming the choices."""
  names = [s.strip().lower() for s in str(settings).split(',') if s.strip()]
  pers = [p.strip().lower() for p in str(activations).split(',') if p.strip()]
  if not names:
    raise ConfigError(f'quantization.settings={settings!r}: name at least one of '
                      f'{", ".join(SETTINGS)} (comma-separated).')
  bad = [n for n in names if n not in SETTINGS]
  if bad:
    raise ConfigError(f'quantization.settings: {bad} are not settings; choose from '
                      f'{", ".join(SETTINGS)}.')
  bad = [p for p in pers if p not in quantization.PER]
  if bad or not pers:
    raise ConfigError(f'quantization.activations={activations!r}: give tensor, token or both '
                      '(comma-separated).')
  if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
    raise ConfigError(f'quantization.group_size={group_size!r}: give the int4 weights\' group '
                      'of inputs, a positive divisor of the model\'s hidden, head and FFN sizes '
                      '(e.g. 128).')
  out = []
  for name in dict.fromkeys(names):
    wbits, abits = SETTINGS[name]
    weights = ('float' if wbits is None else 'int8 per output channel' if wbits == 8 else
               f'int4 per group of {group_size} inputs')
    for per in (pers if abits else ['']):
      out.append({'key': name + (f'_{per}' if per else ''),
                  'name': name.upper() + (f' (per {per})' if per else ''),
                  'weight_bits': wbits, 'group': group_size if wbits == 4 else 0, 'per': per,
                  'act_bits': abits, 'weights': weights,
                  'activations': f'int{abits} per {per}, dynamic' if per else 'float'})
  return out


def _loss_sums(params, batch, *, graphdef, linear_inputs):
  """(summed cross-entropy, tokens, the linear inputs' moments or {}) of one batch."""
  model = nnx.merge(graphdef, params)
  if linear_inputs is not None:
    model = nnx.view(model, linear_inputs=linear_inputs)
  (h_BxTxD, _), sown = nnx.capture(model, nnx.Intermediate)(batch['inputs'], return_hidden=True)
  kernel = model.head_kernel()
  B, T, D = h_BxTxD.shape
  chunk = math.gcd(T, LOSS_CHUNK)

  def chunk_loss(xs):
    h, t, m = xs
    logits = model.logits(h, kernel)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, t[..., None], -1)[..., 0]
    return jnp.sum((lse - target) * m)
  split = lambda x: jnp.moveaxis(x.reshape(B, T // chunk, chunk, *x.shape[2:]), 1, 0)  # noqa: E731
  sums = jax.lax.map(chunk_loss, (split(h_BxTxD), split(batch['targets']),
                                  split(batch['loss_mask'])))
  stats = {}
  for path, value in nnx.to_flat_state(sown):
    stats[path[-1]] = (value.get_value() if isinstance(value, nnx.Variable) else value)[0]
  return jnp.sum(sums), jnp.sum(batch['loss_mask']), stats


class Evaluator:
  """The float model and its quantized versions on one model factory (runs/factory.py): one
  compiled loss step per activation setting, one weight quantization per weight setting."""

  def __init__(self, factory, params):
    self.factory, self.params = factory, params
    self.moe = factory.model_cfg.moe is not None
    self._steps = {}

  def _step(self, linear_inputs):
    if linear_inputs not in self._steps:
      f = functools.partial(_loss_sums, graphdef=self.factory.graphdef,
                            linear_inputs=linear_inputs)
      self._steps[linear_inputs] = self.factory.jit(
          f, in_shardings=(self.factory.param_shardings, self.factory.batch_sharding),
          out_shardings=self.factory.replicated)
    return self._steps[linear_inputs]

  def quantized_params(self, bits: int | None, group: int):
    """(parameters with the block linears' weights on the grid, their names)."""
    if bits is None:
      return self.params, []
    names = ['blocks.' + '.'.join(path)
             for path, _, _ in quantization.linear_kernels(self.params, moe=self.moe)]
    f = self.factory.jit(
        lambda p: quantization.quantize_params(p, bits=bits, group=group, moe=self.moe)[0],
        in_shardings=(self.factory.param_shardings,), out_shardings=self.factory.param_shardings)
    with jax.set_mesh(self.factory.mesh):
      return f(self.params), names

  def loss(self, params, batches, linear_inputs=None) -> tuple[float, float, dict]:
    """(mean cross-entropy, tokens, pooled moments {site: {absmax [L], count, sum1..4 [L]}})."""
    step = self._step(linear_inputs)
    loss_sum = tokens = 0.0
    pooled = {}
    with jax.set_mesh(self.factory.mesh):
      for local in batches:
        out = jax.device_get(step(params, self.factory.global_batch(local)))
        loss_sum, tokens = loss_sum + float(out[0]), tokens + float(out[1])
        for name, moments in out[2].items():
          site = name[len('linear_in_'):]
          acc = pooled.setdefault(site, {})
          for k, v in moments.items():
            v = np.asarray(v, np.float64)
            acc[k] = v if k not in acc else (np.maximum(acc[k], v) if k == 'absmax'
                                             else acc[k] + v)
    return loss_sum / max(tokens, 1.0), tokens, pooled


def input_statistics(pooled: dict) -> dict:
  """{site: {'absmax': [per layer], 'kurtosis': [per layer]}} from Evaluator.loss's moments,
  in model/quantization.py SITES order."""
  out = {}
  for site in quantization.SITES:
    if site not in pooled:
      continue
    m = pooled[site]
    out[site] = {'absmax': [float(x) for x in np.atleast_1d(m['absmax'])],
                 'kurtosis': [quantization.kurtosis(*args) for args in zip(
                     *(np.atleast_1d(m[k]) for k in ('count', 'sum1', 'sum2', 'sum3', 'sum4')))]}
  return out


def evaluate(factory, params, batches, settings: list[dict]) -> dict:
  """The float model's loss and input statistics, then each setting's loss and increase."""
  ev = Evaluator(factory, params)
  loss, tokens, pooled = ev.loss(params, batches, quantization.LinearInputs(stats=True))
  report = {'float': {'loss': loss, 'ppl': math.exp(min(loss, 50.0))}, 'tokens': tokens,
            'linear_inputs': input_statistics(pooled), 'settings': []}
  by_weights = {}
  for s in settings:
    wkey = (s['weight_bits'], s['group'])
    if wkey not in by_weights:
      by_weights.clear()      # one quantized copy of the parameters at a time
      by_weights[wkey] = ev.quantized_params(*wkey)
    qparams, names = by_weights[wkey]
    spec = quantization.LinearInputs(per=s['per'], bits=s['act_bits']) if s['per'] else None
    q_loss = ev.loss(qparams, batches, spec)[0]
    report['settings'].append({**{k: s[k] for k in ('key', 'name', 'weights', 'activations')},
                               'loss': q_loss, 'increase': q_loss - loss})
    report['weights_quantized'] = names or report.get('weights_quantized', [])
    print(f'  {s["name"]:<22} loss {q_loss:.4f} ({q_loss - loss:+.4f} over float)', flush=True)
  if ev.moe:
    report['not_quantized'] = ['the MoE experts\' down-projection inputs (compute dtype)']
  return report


def table(report: dict) -> str:
  """quantization.md: the settings' losses, then the linear inputs' max and kurtosis per layer."""
  f = report['float']
  lines = [f'# {report["variant"]} step {report["step"]}: simulated quantization', '',
           f'{report["batches"]} held-out batches of {report["batch_size"]} x '
           f'{report["seq_len"]} tokens; int4 groups of {report["group_size"]} inputs.', '',
           '| setting | weights | activations (linear inputs) | loss | increase over float |',
           '|---|---|---|---|---|',
           f'| float | float | float | {f["loss"]:.4f} | - |']
  for s in report['settings']:
    lines.append(f'| {s["name"]} | {s["weights"]} | {s["activations"]} | {s["loss"]:.4f} | '
                 f'{s["increase"]:+.4f} |')
  stats = report['linear_inputs']
  if stats:
    layers = len(next(iter(stats.values()))['absmax'])
    lines += ['', 'Linear inputs of the float model: max |x| / kurtosis (3 for a Gaussian), '
              'per layer', '', '| input | ' + ' | '.join(f'layer {i}' for i in range(layers)) +
              ' |', '|---|' + '---|' * layers]
    for site, v in stats.items():
      lines.append(f'| {site} | ' + ' | '.join(
          f'{a:.1f} / {k:.1f}' for a, k in zip(v['absmax'], v['kurtosis'])) + ' |')
  return '\n'.join(lines) + '\n'
