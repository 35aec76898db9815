"""Where each Hugging Face (Qwen3) tensor lives in the project's parameter tree, and back.

HF `nn.Linear` weights are [out, in]; the project's kernels are [in, *out] (attention.py,
layers.py), and every block parameter is stacked on a leading layers axis (model.py, nnx.vmap):
  q_proj [H*d, D]          -> blocks.attn.wq [L, D, H, d]
  k_proj / v_proj [K*d, D] -> blocks.attn.wk / wv [L, D, K, d]
  o_proj [D, H*d]          -> blocks.attn.wo [L, H, d, D]
  q_norm / k_norm [d]      -> blocks.attn.q_norm / k_norm.scale [L, d]   (HF stores the scale
                              itself, `weight * x_normed`, not 1 + scale)
  input_layernorm / post_attention_layernorm [D] -> blocks.attn_norm / ffn_norm.scale [L, D]
  gate_proj / up_proj [F, D] -> blocks.ffn.wi_gate / wi_up [L, D, F];  down_proj [D, F] -> wo
  embed_tokens [V, D] -> embed.embedding;  norm [D] -> final_norm.scale;  lm_head [V, D] ->
  lm_head [D, V] (absent when tied).
The authors' gated Qwen3 (G1, Qiu et al. 2025, Sec. 2.2) widens q_proj instead of adding a gate
weight: its output viewed as [K, -1] holds, per KV head k, [G*d queries | G*g gate logits] for
the query heads k*G .. k*G+G-1 (G = H/K; g = 1 headwise, d elementwise). Query head h reads KV
head h // G in both codebases, so heads keep their order: the gate kernel is [L, D, H] headwise,
[L, D, H, d] elementwise.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Dims:
  L: int
  D: int
  H: int
  K: int
  d: int
  F: int
  V: int
  gate: str          # none | headwise | elementwise
  tied: bool

  @property
  def G(self) -> int:
    return self.H // self.K

  @property
  def gate_width(self) -> int:
    """Gate logits per query head in the widened q_proj (0: no gate)."""
    return {'none': 0, 'headwise': 1, 'elementwise': self.d}[self.gate]


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF tensor: its name and shape, the project paths it fills (at `layer` of the stacked
  axis, or whole when None), and the conversions HF -> project parts and back."""
  name: str
  shape: tuple
  layer: int | None
  paths: tuple
  split: object      # hf array -> tuple of project arrays (one per path)
  join: object       # project arrays -> hf array


def _linear(shape_in_out: tuple, n_in: int):
  """[out, in] <-> kernel of `shape_in_out` whose first `n_in` axes are the inputs."""
  n_inputs = int(np.prod(shape_in_out[:n_in]))
  return (lambda w: (w.T.reshape(shape_in_out),),
          lambda p: p.reshape(n_inputs, -1).T)


def _identity():
  return (lambda w: (w,)), (lambda p: p)


def _q_proj(dims: Dims):
  """The (widened) q_proj <-> wq and, when gated, the G1 gate kernel."""
  D, H, K, d, G, g = dims.D, dims.H, dims.K, dims.d, dims.G, dims.gate_width
  if not g:
    return _linear((D, H, d), 1)
  gate_shape = (D, H) if dims.gate == 'headwise' else (D, H, d)

  def split(w):
    w_DxKxW = w.T.reshape(D, K, G * d + G * g)
    return (w_DxKxW[:, :, :G * d].reshape(D, H, d), w_DxKxW[:, :, G * d:].reshape(gate_shape))

  def join(wq, gate):
    w_DxKxW = np.concatenate([wq.reshape(D, K, G * d), gate.reshape(D, K, G * g)], axis=-1)
    return w_DxKxW.reshape(D, -1).T

  return split, join


def _layer_entries(dims: Dims, i: int) -> list[Entry]:
  D, H, K, d, F = dims.D, dims.H, dims.K, dims.d, dims.F
  attn = ('blocks', 'attn')
  q_paths = (attn + ('wq',),) + ((attn + ('gate', 'kernel'),) if dims.gate_width else ())
  table = [
      ('self_attn.q_proj.weight', (H * d + H * dims.gate_width, D), q_paths, _q_proj(dims)),
      ('self_attn.k_proj.weight', (K * d, D), (attn + ('wk',),), _linear((D, K, d), 1)),
      ('self_attn.v_proj.weight', (K * d, D), (attn + ('wv',),), _linear((D, K, d), 1)),
      ('self_attn.o_proj.weight', (D, H * d), (attn + ('wo',),), _linear((H, d, D), 2)),
      ('self_attn.q_norm.weight', (d,), (attn + ('q_norm', 'scale'),), _identity()),
      ('self_attn.k_norm.weight', (d,), (attn + ('k_norm', 'scale'),), _identity()),
      ('mlp.gate_proj.weight', (F, D), (('blocks', 'ffn', 'wi_gate'),), _linear((D, F), 1)),
      ('mlp.up_proj.weight', (F, D), (('blocks', 'ffn', 'wi_up'),), _linear((D, F), 1)),
      ('mlp.down_proj.weight', (D, F), (('blocks', 'ffn', 'wo'),), _linear((F, D), 1)),
      ('input_layernorm.weight', (D,), (('blocks', 'attn_norm', 'scale'),), _identity()),
      ('post_attention_layernorm.weight', (D,), (('blocks', 'ffn_norm', 'scale'),), _identity()),
  ]
  return [Entry(f'model.layers.{i}.{suffix}', shape, i, paths, *fns)
          for suffix, shape, paths, fns in table]


def entries(dims: Dims) -> list[Entry]:
  """Every tensor of the HF checkpoint, in the order HF writes them."""
  out = [Entry('model.embed_tokens.weight', (dims.V, dims.D), None, (('embed', 'embedding'),),
               *_identity())]
  for i in range(dims.L):
    out += _layer_entries(dims, i)
  out.append(Entry('model.norm.weight', (dims.D,), None, (('final_norm', 'scale'),),
                   *_identity()))
  if not dims.tied:
    out.append(Entry('lm_head.weight', (dims.V, dims.D), None, (('lm_head',),),
                     *_linear((dims.D, dims.V), 1)))
  return out


# HF tensors that are not parameters (rotary buffers some old checkpoints hold).
IGNORED_SUFFIXES = ('.rotary_emb.inv_freq',)


def _get(tree: dict, path: tuple):
  for k in path:
    tree = tree[k]
  return tree


def to_params(dims: Dims, read) -> dict:
  """The project's parameter tree (float32 numpy) from `read(name)` (HF layout, any float dtype;
  the cast to float32 happens on assignment, one tensor at a time)."""
  tree = {}
  for e in entries(dims):
    for path, part in zip(e.paths, e.split(read(e.name))):
      parent = tree
      for k in path[:-1]:
        parent = parent.setdefault(k, {})
      if e.layer is None:
        parent[path[-1]] = np.array(part, dtype=np.float32)
        continue
      if path[-1] not in parent:
        parent[path[-1]] = np.empty((dims.L, *part.shape), np.float32)
      parent[path[-1]][e.layer] = part
  return tree


def from_params(dims: Dims, params: dict, e: Entry) -> np.ndarray:
  """The HF tensor of entry `e` (float32) from the project's parameter tree."""
  parts = []
  for path in e.paths:
    x = _get(params, path)
    parts.append(np.asarray(x[e.layer] if e.layer is not None else x, dtype=np.float32))
  return e.join(*parts)


def param_shapes(dims: Dims) -> dict:
  """{project path: stacked shape} that `to_params` produces."""
  out = {}
  for e in entries(dims):
    for path, part in zip(e.paths, e.split(np.zeros(e.shape, np.float32))):
      out[path] = part.shape if e.layer is None else (dims.L, *part.shape)
  return out
