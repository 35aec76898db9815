"""Where each Qwen3-Next / Qwen3.5 tensor lives in the project's parameter tree, and back.

HF `nn.Linear` weights are [out, in]; the project's kernels are [in, *out]. A hybrid's blocks
are stacked by layer-pattern period (model/transformer.py LayerPeriod): layer l is
`blocks.layer_<l % P>` at index l // P (P the period, 4 for three DeltaNets and one attention
layer); a model whose layers are all full attention stacks `blocks` [L, ...] as the paper's.
Per layer, under the language model's prefix (`model.`, or `model.language_model.` in a
multimodal Qwen3.5 release):
  input_layernorm / post_attention_layernorm [D]  -> attn_norm / ffn_norm.scale   (w of 1 + w)
  self_attn.q_proj [2 H d, D]: per query head h, [q_h (d) | g_h (d)] (the G1 gate's logits)
                                                  -> attn.wq [D, H, d], attn.gate.kernel [D, H, d]
  self_attn.k_proj / v_proj [K d, D] -> attn.wk / wv [D, K, d];  o_proj [D, H d] -> attn.wo
  self_attn.q_norm / k_norm [d]      -> attn.q_norm / k_norm.scale (w of 1 + w)
  linear_attn (model/deltanet.py's module docstring names each parameter):
    Qwen3.5     in_proj_qkv [2 Kh dk + Hv dv, D] (rows q | k | v, head-major), in_proj_z
                [Hv dv, D], in_proj_b / in_proj_a [Hv, D]
    Qwen3-Next  in_proj_qkvz [2 Kh dk + 2 Hv dv, D]: per key head [q (dk) | k (dk) | v (G dv) |
                z (G dv)], in_proj_ba [2 Hv, D]: per key head [b (G) | a (G)]  (G = Hv / Kh;
                value head k G + g reads key head k, as the model's group-major order)
                -> linear_attn.wq, wk [D, Kh, dk], wv, wz [D, Hv, dv], wb, wa [D, Hv]
    conv1d.weight [2 Kh dk + Hv dv, 1, W], channels q | k | v (tap w: the input W-1-w tokens
                back) -> linear_attn.conv_q, conv_k [W, Kh, dk], conv_v [W, Hv, dv]
    A_log, dt_bias [Hv]; norm.weight [dv] (the gated RMSNorm's plain w) -> norm.scale;
    out_proj [D, Hv dv] -> linear_attn.wo [Hv, dv, D]
  mlp (dense): gate_proj / up_proj [F, D] -> ffn.wi_gate / wi_up [D, F]; down_proj -> ffn.wo
  mlp (MoE): gate.weight [E, D] -> ffn.router [D, E]; experts per expert
    (experts.<e>.gate_proj / up_proj [I, D], down_proj [D, I]: what transformers'
    save_pretrained writes and the Qwen3-Next release holds) or fused (experts.gate_up_proj
    [E, 2 I, D]: gate rows then up rows, experts.down_proj [E, D, I]: the Qwen3.5 MoE release)
    -> ffn.wi_gate / wi_up [E, D, I], ffn.wo [E, I, D]; shared_expert.{gate,up,down}_proj
    -> ffn.shared_wi_gate / shared_wi_up [D, S], shared_wo [S, D]; shared_expert_gate [1, D]
    -> ffn.shared_gate [D]
Outside the layers: embed_tokens -> embed.embedding, norm -> final_norm.scale (1 + w), lm_head
[V, D] -> lm_head [D, V] (absent when tied). Export writes experts one by one (transformers'
own format; it loads both).
"""

import dataclasses

import numpy as np

SKIPPED_PREFIXES = {'mtp.': 'the multi-token-prediction head (mtp.*)',
                    'model.visual.': 'the vision tower (model.visual.*)'}


@dataclasses.dataclass(frozen=True)
class HybridDims:
  family: str          # qwen3_next | qwen3_5_text | qwen3_5_moe_text (the text model's type)
  prefix: str          # of the language model's weights: model. | model.language_model.
  L: int
  D: int
  H: int
  K: int
  d: int
  V: int
  tied: bool
  layer_types: tuple
  Kh: int
  Hv: int
  dk: int
  dv: int
  W: int
  F: int = 0           # dense MLP width (0: MoE)
  E: int = 0           # routed experts
  top_k: int = 0
  I: int = 0           # expert width
  S: int = 0           # shared expert width
  renormalize: bool = True
  fused_experts: bool = False   # experts.gate_up_proj / down_proj [E, ...] (import only)

  @property
  def is_hybrid(self) -> bool:
    return 'linear_attention' in self.layer_types

  @property
  def period(self) -> int:
    """The layer pattern's period (ModelConfig.layer_period), 1 without linear layers."""
    if not self.is_hybrid:
      return 1
    types = self.layer_types
    return next(p for p in range(1, self.L + 1)
                if self.L % p == 0 and types == types[:p] * (self.L // p))


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF tensor: its name and shape; the project parameters it fills (`paths`, each of full
  stacked shape `stacked`) at `index` of their leading axes ((): whole); the conversions."""
  name: str
  shape: tuple
  paths: tuple
  stacked: tuple
  index: tuple
  split: object      # hf array -> tuple of project arrays (one per path)
  join: object       # project arrays -> hf array


def _linear(D: int, out: tuple):
  """[prod(out), D] <-> a kernel [D, *out]."""
  return (lambda w: (w.T.reshape(D, *out),), lambda p: p.reshape(D, -1).T)


def _linear_in(inputs: tuple, D: int):
  """[D, prod(inputs)] <-> a kernel [*inputs, D]."""
  return (lambda w: (w.T.reshape(*inputs, D),), lambda p: p.reshape(-1, D).T)


def _identity():
  return (lambda w: (w,)), (lambda p: p)


def _columns(D: int, shapes: list):
  """A [sum, D] weight whose rows are consecutive blocks <-> kernels [D, *shape] each."""
  sizes = [int(np.prod(s)) for s in shapes]
  bounds = np.cumsum([0] + sizes)

  def split(w):
    wt = w.T
    return tuple(wt[:, a:b].reshape(D, *s) for a, b, s in zip(bounds, bounds[1:], shapes))

  return split, lambda *ps: np.concatenate([p.reshape(D, -1) for p in ps], axis=1).T


def _per_head(D: int, groups: int, widths: list, shapes: list):
  """A [groups * sum(widths), D] weight holding, per group, blocks of `widths` rows <->
  kernels [D, *shape] each (a block's groups concatenated, group-major)."""
  bounds = np.cumsum([0] + widths)

  def split(w):
    w_DxGxW = w.T.reshape(D, groups, -1)
    return tuple(w_DxGxW[:, :, a:b].reshape(D, *s)
                 for a, b, s in zip(bounds, bounds[1:], shapes))

  def join(*ps):
    return np.concatenate([p.reshape(D, groups, -1) for p in ps], axis=-1).reshape(D, -1).T

  return split, join


def _conv(W: int, shapes: list):
  """conv1d.weight [C, 1, W] (channels: the blocks of `shapes`) <-> kernels [W, *shape]."""
  sizes = [int(np.prod(s)) for s in shapes]
  bounds = np.cumsum([0] + sizes)

  def split(w):
    w_WxC = w[:, 0, :].T
    return tuple(w_WxC[:, a:b].reshape(W, *s) for a, b, s in zip(bounds, bounds[1:], shapes))

  return split, lambda *ps: np.concatenate([p.reshape(W, -1) for p in ps], axis=1).T[:, None, :]


def _transpose_last():
  """[E, out, in] <-> [E, in, out]."""
  return (lambda w: (np.swapaxes(w, -1, -2),), lambda p: np.swapaxes(p, -1, -2))


def _attention(dims: HybridDims):
  D, H, K, d = dims.D, dims.H, dims.K, dims.d
  return [
      ('self_attn.q_proj.weight', (2 * H * d, D), ('attn', 'wq'), ('attn', 'gate', 'kernel'),
       _per_head(D, H, [d, d], [(H, d), (H, d)])),
      ('self_attn.k_proj.weight', (K * d, D), ('attn', 'wk'), _linear(D, (K, d))),
      ('self_attn.v_proj.weight', (K * d, D), ('attn', 'wv'), _linear(D, (K, d))),
      ('self_attn.o_proj.weight', (D, H * d), ('attn', 'wo'), _linear_in((H, d), D)),
      ('self_attn.q_norm.weight', (d,), ('attn', 'q_norm', 'scale'), _identity()),
      ('self_attn.k_norm.weight', (d,), ('attn', 'k_norm', 'scale'), _identity()),
  ]


def _linear_attention(dims: HybridDims):
  D, Kh, Hv, dk, dv, W = dims.D, dims.Kh, dims.Hv, dims.dk, dims.dv, dims.W
  G = Hv // Kh
  la = lambda *p: ('linear_attn',) + p  # noqa: E731
  if dims.family == 'qwen3_next':
    projections = [
        ('linear_attn.in_proj_qkvz.weight', (2 * Kh * dk + 2 * Hv * dv, D), la('wq'), la('wk'),
         la('wv'), la('wz'),
         _per_head(D, Kh, [dk, dk, G * dv, G * dv], [(Kh, dk), (Kh, dk), (Hv, dv), (Hv, dv)])),
        ('linear_attn.in_proj_ba.weight', (2 * Hv, D), la('wb'), la('wa'),
         _per_head(D, Kh, [G, G], [(Hv,), (Hv,)])),
    ]
  else:
    projections = [
        ('linear_attn.in_proj_qkv.weight', (2 * Kh * dk + Hv * dv, D), la('wq'), la('wk'),
         la('wv'), _columns(D, [(Kh, dk), (Kh, dk), (Hv, dv)])),
        ('linear_attn.in_proj_z.weight', (Hv * dv, D), la('wz'), _linear(D, (Hv, dv))),
        ('linear_attn.in_proj_b.weight', (Hv, D), la('wb'), _linear(D, (Hv,))),
        ('linear_attn.in_proj_a.weight', (Hv, D), la('wa'), _linear(D, (Hv,))),
    ]
  return projections + [
      ('linear_attn.conv1d.weight', (2 * Kh * dk + Hv * dv, 1, W), la('conv_q'), la('conv_k'),
       la('conv_v'), _conv(W, [(Kh, dk), (Kh, dk), (Hv, dv)])),
      ('linear_attn.A_log', (Hv,), la('A_log'), _identity()),
      ('linear_attn.dt_bias', (Hv,), la('dt_bias'), _identity()),
      ('linear_attn.norm.weight', (dv,), la('norm', 'scale'), _identity()),
      ('linear_attn.out_proj.weight', (D, Hv * dv), la('wo'), _linear_in((Hv, dv), D)),
  ]


def _ffn(dims: HybridDims):
  """(suffix, shape, paths..., fns, expert index or None) of one layer's FFN."""
  D, F, E, I, S = dims.D, dims.F, dims.E, dims.I, dims.S
  if not E:
    return [('mlp.gate_proj.weight', (F, D), ('ffn', 'wi_gate'), _linear(D, (F,)), None),
            ('mlp.up_proj.weight', (F, D), ('ffn', 'wi_up'), _linear(D, (F,)), None),
            ('mlp.down_proj.weight', (D, F), ('ffn', 'wo'), _linear_in((F,), D), None)]
  out = [('mlp.gate.weight', (E, D), ('ffn', 'router'), _linear(D, (E,)), None)]
  if dims.fused_experts:
    up_split = lambda w: (np.swapaxes(w[:, :I], 1, 2), np.swapaxes(w[:, I:], 1, 2))  # noqa: E731
    up_join = lambda g, u: np.concatenate([np.swapaxes(g, 1, 2), np.swapaxes(u, 1, 2)], 1)  # noqa: E731
    out += [('mlp.experts.gate_up_proj', (E, 2 * I, D), ('ffn', 'wi_gate'), ('ffn', 'wi_up'),
             (up_split, up_join), None),
            ('mlp.experts.down_proj', (E, D, I), ('ffn', 'wo'), _transpose_last(), None)]
  else:
    for e in range(E):
      out += [(f'mlp.experts.{e}.gate_proj.weight', (I, D), ('ffn', 'wi_gate'),
               _linear(D, (I,)), e),
              (f'mlp.experts.{e}.up_proj.weight', (I, D), ('ffn', 'wi_up'), _linear(D, (I,)), e),
              (f'mlp.experts.{e}.down_proj.weight', (D, I), ('ffn', 'wo'),
               _linear_in((I,), D), e)]
  return out + [
      ('mlp.shared_expert.gate_proj.weight', (S, D), ('ffn', 'shared_wi_gate'),
       _linear(D, (S,)), None),
      ('mlp.shared_expert.up_proj.weight', (S, D), ('ffn', 'shared_wi_up'), _linear(D, (S,)),
       None),
      ('mlp.shared_expert.down_proj.weight', (D, S), ('ffn', 'shared_wo'), _linear_in((S,), D),
       None),
      ('mlp.shared_expert_gate.weight', (1, D), ('ffn', 'shared_gate'),
       (lambda w: (w[0],), lambda p: p[None, :]), None),
  ]


def _param_shape(dims: HybridDims, path: tuple) -> tuple:
  """The unstacked shape of a block parameter (the stacked axes are added by the caller)."""
  D, H, K, d, Kh, Hv, dk, dv, W = (dims.D, dims.H, dims.K, dims.d, dims.Kh, dims.Hv, dims.dk,
                                   dims.dv, dims.W)
  E, I, S, F = dims.E, dims.I, dims.S, dims.F
  return {
      ('attn', 'wq'): (D, H, d), ('attn', 'gate', 'kernel'): (D, H, d), ('attn', 'wk'): (D, K, d),
      ('attn', 'wv'): (D, K, d), ('attn', 'wo'): (H, d, D), ('attn', 'q_norm', 'scale'): (d,),
      ('attn', 'k_norm', 'scale'): (d,),
      ('linear_attn', 'wq'): (D, Kh, dk), ('linear_attn', 'wk'): (D, Kh, dk),
      ('linear_attn', 'wv'): (D, Hv, dv), ('linear_attn', 'wz'): (D, Hv, dv),
      ('linear_attn', 'wb'): (D, Hv), ('linear_attn', 'wa'): (D, Hv),
      ('linear_attn', 'conv_q'): (W, Kh, dk), ('linear_attn', 'conv_k'): (W, Kh, dk),
      ('linear_attn', 'conv_v'): (W, Hv, dv), ('linear_attn', 'A_log'): (Hv,),
      ('linear_attn', 'dt_bias'): (Hv,), ('linear_attn', 'norm', 'scale'): (dv,),
      ('linear_attn', 'wo'): (Hv, dv, D),
      ('attn_norm', 'scale'): (D,), ('ffn_norm', 'scale'): (D,),
      ('ffn', 'router'): (D, E), ('ffn', 'shared_wi_gate'): (D, S),
      ('ffn', 'shared_wi_up'): (D, S), ('ffn', 'shared_wo'): (S, D), ('ffn', 'shared_gate'): (D,),
      ('ffn', 'wi_gate'): (E, D, I) if E else (D, F), ('ffn', 'wi_up'): (E, D, I) if E else (D, F),
      ('ffn', 'wo'): (E, I, D) if E else (F, D),
  }[path]


def entries(dims: HybridDims) -> list[Entry]:
  """Every tensor of the language model's checkpoint, in the order transformers writes them."""
  p = dims.prefix
  out = [Entry(f'{p}embed_tokens.weight', (dims.V, dims.D), (('embed', 'embedding'),),
               ((dims.V, dims.D),), (), *_identity())]
  P = dims.period
  N = dims.L // P
  for layer, layer_type in enumerate(dims.layer_types):
    base = ('blocks', f'layer_{layer % P}') if dims.is_hybrid else ('blocks',)
    stack = (N,) if dims.is_hybrid else (dims.L,)
    position = (layer // P,) if dims.is_hybrid else (layer,)
    mixer = _linear_attention(dims) if layer_type == 'linear_attention' else _attention(dims)
    rows = [('input_layernorm.weight', (dims.D,), ('attn_norm', 'scale'), _identity(), None)]
    rows += [r + (None,) for r in mixer]
    rows += [('post_attention_layernorm.weight', (dims.D,), ('ffn_norm', 'scale'), _identity(),
              None)]
    rows += _ffn(dims)
    for suffix, shape, *rest in rows:
      paths, (split, join), expert = rest[:-2], rest[-2], rest[-1]
      index = position if expert is None else position + (expert,)
      out.append(Entry(f'{p}layers.{layer}.{suffix}', shape,
                       tuple(base + path for path in paths),
                       tuple(stack + _param_shape(dims, path) for path in paths),
                       index, split, join))
  out.append(Entry(f'{p}norm.weight', (dims.D,), (('final_norm', 'scale'),), ((dims.D,),), (),
                   *_identity()))
  if not dims.tied:
    out.append(Entry('lm_head.weight', (dims.V, dims.D), (('lm_head',),), ((dims.D, dims.V),),
                     (), *_linear(dims.D, (dims.V,))))
  return out


def is_skipped(name: str, dims: HybridDims) -> bool:
  """Whether a checkpoint tensor lies outside the language model and is left by an import: the
  multi-token-prediction head (mtp.*) and, in a multimodal release, the vision tower."""
  return name.startswith('mtp.') or (dims.prefix != 'model.' and name.startswith('model.visual.'))


def skipped(names, dims: HybridDims) -> dict:
  """{what: count} of the checkpoint's tensors that an import leaves (is_skipped), by what."""
  out = {}
  for name in names:
    if is_skipped(name, dims):
      what = next(w for p, w in SKIPPED_PREFIXES.items() if name.startswith(p))
      out[what] = out.get(what, 0) + 1
  return out


def _get(tree: dict, path: tuple):
  for k in path:
    tree = tree[k]
  return tree


def to_params(table: list[Entry], read) -> dict:
  """The project's parameter tree (float32 numpy) from `read(name)` (any float dtype), one
  tensor at a time."""
  tree = {}
  for e in table:
    for path, full, part in zip(e.paths, e.stacked, e.split(read(e.name))):
      parent = tree
      for k in path[:-1]:
        parent = parent.setdefault(k, {})
      if not e.index:
        parent[path[-1]] = np.array(part, dtype=np.float32)
        continue
      if path[-1] not in parent:
        parent[path[-1]] = np.empty(full, np.float32)
      parent[path[-1]][e.index] = part
  return tree


def from_params(params: dict, e: Entry) -> np.ndarray:
  """The HF tensor of entry `e` (float32) from the project's parameter tree."""
  return e.join(*[np.asarray(_get(params, path)[e.index] if e.index else _get(params, path),
                             dtype=np.float32) for path in e.paths])


def param_shapes(table: list[Entry]) -> dict:
  """{project path: stacked shape} that `to_params` produces."""
  return {path: full for e in table for path, full in zip(e.paths, e.stacked)}
