"""A plain numpy float64 reference of the dense gated-attention decoder, for the tests.

Written from the paper (Qiu et al. 2025, Sec. 2-3 and Appendix) and the Hugging Face conventions (Qwen3 / LLaMA rotate-half
RoPE, HF's YaRN), independently of the JAX code: nothing here imports jax, flax or
gated_attention. Only the parameter *names* follow the JAX model, so that the parameters can be
taken from `nnx.state(model)` (see `to_float64`).

Conventions (shapes): B batch, T sequence, D hidden, H query heads, K KV heads, G = H // K,
d head_dim, F ffn size, V vocabulary, L layers.
  wq [D, H, d], wk / wv [D, K, d], wo [H, d, D]; query head h reads KV head h // G.
  Gates (kernel: input-dependent; bias: input-independent; scale: per-head RMSNorm):
    G1 (SDPA output, per query head)  elementwise kernel [D, H, d], headwise [D, H]
    G2 / G3 (value / key, per KV head) elementwise [D, K, d], headwise [D, K]
    G4 (query projection)              elementwise [D, H, d]
    G5 (output of W_O)                 [D, D]
  Block (pre-norm, optional sandwich norm):  h += [N](Attn(N(h)));  h += [N](SwiGLU(N(h))).
"""

import math

import numpy as np

# Tiny shapes the tests use for whole models.
TINY_MODEL = dict(vocab_size=61, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2,
                  head_dim=8, ffn_size=48, init_std=0.25)

GATE_RMSNORM_EPS = 1e-6   # eps of the G1 per-head RMSNorm ("SDPA GroupNorm")


# --------------------------------------------------------------------------------------------
# Parameter conversion
# --------------------------------------------------------------------------------------------

def to_float64(tree):
  """Nested mapping of arrays (e.g. `nnx.to_pure_dict(nnx.state(model))`) -> float64 numpy."""
  if hasattr(tree, 'items'):
    return {str(k): to_float64(v) for k, v in tree.items()}
  return np.asarray(tree, dtype=np.float64)


def layer(tree, i):
  """Layer i of parameters stacked on a leading layers axis."""
  if isinstance(tree, dict):
    return {k: layer(v, i) for k, v in tree.items()}
  return tree[i]


# --------------------------------------------------------------------------------------------
# Elementary functions
# --------------------------------------------------------------------------------------------

def sigmoid(z):
  z = np.asarray(z, np.float64)
  return np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))),
                  np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))


def silu(z):
  return z * sigmoid(z)


def rms_norm(x, scale, eps):
  """x / sqrt(mean(x^2) + eps) * scale over the last axis."""
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def swiglu(x, w_gate, w_up, w_down):
  return (silu(x @ w_gate) * (x @ w_up)) @ w_down


def embed(table, tokens):
  return np.asarray(table)[np.asarray(tokens)]


def softmax(z, axis=-1):
  z = z - np.max(z, axis=axis, keepdims=True)
  e = np.exp(z)
  return e / np.sum(e, axis=axis, keepdims=True)


# --------------------------------------------------------------------------------------------
# RoPE (rotate-half layout) and YaRN (Hugging Face's `_compute_yarn_parameters`)
# --------------------------------------------------------------------------------------------

def yarn_hf(dim, base, factor, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0):
  """(inv_freq, attention_factor) as Hugging Face transformers computes them for YaRN."""

  def get_mscale(scale, mscale=1.0):
    if scale <= 1:
      return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0

  def find_correction_dim(num_rotations):
    return (dim * math.log(original_max_position_embeddings / (num_rotations * 2 * math.pi))
            / (2 * math.log(base)))

  low = max(math.floor(find_correction_dim(beta_fast)), 0)
  high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
  inv_freq_extrapolation = 1.0 / pos_freqs
  inv_freq_interpolation = 1.0 / (factor * pos_freqs)
  extrapolation_factor = 1.0 - ramp
  inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
              + inv_freq_extrapolation * extrapolation_factor)
  return inv_freq, get_mscale(factor)


def rope_parameters(head_dim, base, scaling=None):
  """(inv_freq [d/2], scale of sin/cos) for rope_scaling None / type none / type yarn."""
  if scaling is None or scaling.get('type', 'none') == 'none':
    return 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim), 1.0
  assert scaling['type'] == 'yarn', scaling
  return yarn_hf(head_dim, base, float(scaling['factor']), float(scaling['original_max_len']))


def rotate_half(x):
  half = x.shape[-1] // 2
  return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x_BxTxNxd, positions_BxT, inv_freq, mscale=1.0):
  """HF's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos/sin = cat(f, f)."""
  freqs = np.asarray(positions_BxT, np.float64)[..., None] * inv_freq      # [B, T, d/2]
  emb = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]              # [B, T, 1, d]
  cos, sin = np.cos(emb) * mscale, np.sin(emb) * mscale
  return x_BxTxNxd * cos + rotate_half(x_BxTxNxd) * sin


# --------------------------------------------------------------------------------------------
# Causal grouped-query attention
# --------------------------------------------------------------------------------------------

def _visible(segment_ids_BxT, b, t):
  """Keys query t of sequence b may see: 0..t, and of its own document with segment ids."""
  keys = np.arange(t + 1)
  if segment_ids_BxT is not None:
    keys = keys[np.asarray(segment_ids_BxT)[b, :t + 1] == np.asarray(segment_ids_BxT)[b, t]]
  return keys


def causal_gqa_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT=None):
  """Returns (output [B, T, H, d], probabilities [B, H, T, T]); head h reads KV head h // G.
  With `segment_ids_BxT` a query sees only the earlier keys of the same id (its document)."""
  B, T, H, d = q_BxTxHxd.shape
  K = k_BxTxKxd.shape[2]
  G = H // K
  out = np.zeros((B, T, H, d))
  probs = np.zeros((B, H, T, T))
  for b in range(B):
    for h in range(H):
      kv = h // G
      for t in range(T):
        keys = _visible(segment_ids_BxT, b, t)
        s = k_BxTxKxd[b, keys, kv] @ q_BxTxHxd[b, t, h] / math.sqrt(d)
        p = softmax(s)
        probs[b, h, t, keys] = p
        out[b, t, h] = p @ v_BxTxKxd[b, keys, kv]
  return out, probs


def causal_gqa_attention_grads(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, dout_BxTxHxd,
                               segment_ids_BxT=None):
  """Gradients (dq, dk, dv) of sum(causal_gqa_attention(q, k, v)[0] * dout), by hand:
  dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)."""
  _, probs = causal_gqa_attention(q_BxTxHxd, k_BxTxKxd, v_BxTxKxd, segment_ids_BxT)
  B, T, H, d = q_BxTxHxd.shape
  G = H // k_BxTxKxd.shape[2]
  dq, dk, dv = (np.zeros(x.shape) for x in (q_BxTxHxd, k_BxTxKxd, v_BxTxKxd))
  for b in range(B):
    for h in range(H):
      kv, p = h // G, probs[b, h]                                     # [T, T], zeros masked
      do = dout_BxTxHxd[b, :, h]
      dv[b, :, kv] += p.T @ do
      dp = do @ v_BxTxKxd[b, :, kv].T
      ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True)) / math.sqrt(d)
      dq[b, :, h] = ds @ k_BxTxKxd[b, :, kv]
      dk[b, :, kv] += ds.T @ q_BxTxHxd[b, :, h]
  return dq, dk, dv


# --------------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------------

GATE_DEFAULTS = dict(position='none', kind='gate', granularity='elementwise', head_shared=False,
                     shared_reduce='score', mode='multiplicative', activation='sigmoid',
                     input_dependent=True, after_qk_norm_rope=False)
_HOOK = {'g1': 'sdpa', 'g2': 'v', 'g3': 'k', 'g4': 'q', 'g5': 'out'}
ACTIVATIONS = {
    'sigmoid': sigmoid,
    'silu': silu,
    'ns_sigmoid': lambda z: 0.5 + 0.5 * sigmoid(z),
    'identity': lambda z: z,
}


def gate_hook(spec):
  """Where the gate acts: 'sdpa' | 'v' | 'k' | 'q' | 'out', '+_rope' after QK-norm and RoPE."""
  spec = dict(GATE_DEFAULTS, **spec)
  if spec['position'] == 'none':
    return None
  return _HOOK[spec['position']] + ('_rope' if spec['after_qk_norm_rope'] else '')


def gate_scores(spec, p, x_BxTxD):
  """act(X W) shaped to broadcast against the gated tensor ([B, T, N, d|1] or [B, T, D])."""
  spec = dict(GATE_DEFAULTS, **spec)
  x = np.asarray(x_BxTxD, np.float64)
  act = ACTIVATIONS[spec['activation']]
  if spec['input_dependent']:
    logits = np.tensordot(x, p['kernel'], axes=([-1], [0]))     # [B, T, *kernel.shape[1:]]
  else:
    logits = np.asarray(p['bias'])[None, None]                  # the same for every token
  if spec['granularity'] == 'headwise':
    logits = logits[..., None]                                  # one scalar per head
  if not spec['head_shared']:
    return act(logits)
  n = logits.shape[2]
  if spec['shared_reduce'] == 'logit':
    return act(sum(logits[:, :, i:i + 1] for i in range(n)) / n)
  return sum(act(logits[:, :, i:i + 1]) for i in range(n)) / n


def gate_apply(spec, p, hook, y, x_BxTxD):
  """The gate (or G1 ablation) applied at `hook`; y passes through at any other hook."""
  spec = dict(GATE_DEFAULTS, **spec)
  if hook != gate_hook(spec):
    return y
  if spec['kind'] == 'silu_noparam':
    return silu(y)
  if spec['kind'] == 'rmsnorm':
    return rms_norm(y, p['scale'], GATE_RMSNORM_EPS)
  s = gate_scores(spec, p, x_BxTxD)
  return y * s if spec['mode'] == 'multiplicative' else y + s


# --------------------------------------------------------------------------------------------
# Gated DeltaNet (Yang et al. 2025; the linear-attention layers of Qwen3-Next / Qwen3.5)
# --------------------------------------------------------------------------------------------

def l2_normalize(x, eps=1e-6):
  return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def softplus(z):
  z = np.asarray(z, np.float64)
  return np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))


def short_conv(x_BxTxC, kernel_WxC, segment_ids_BxT=None, past_BxW1xC=None):
  """Causal depthwise conv, written as a loop: out[t] = sum_w kernel[w] x[t - (W-1) + w], inputs
  before the window from `past` (else zero), with segment ids only those of t's document."""
  B, T, C = x_BxTxC.shape
  W = kernel_WxC.shape[0]
  past = np.zeros((B, W - 1, C)) if past_BxW1xC is None else np.asarray(past_BxW1xC, np.float64)
  out = np.zeros((B, T, C))
  for b in range(B):
    for t in range(T):
      for w in range(W):
        s = t - (W - 1) + w
        if s < 0:
          out[b, t] += kernel_WxC[w] * past[b, W - 1 + s]
        elif segment_ids_BxT is None or segment_ids_BxT[b, s] == segment_ids_BxT[b, t]:
          out[b, t] += kernel_WxC[w] * x_BxTxC[b, s]
  return out


def gated_delta_rule(q_BxTxHxk, k_BxTxHxk, v_BxTxHxv, g_BxTxH, beta_BxTxH, state_BxHxkxv=None,
                     segment_ids_BxT=None):
  """The gated delta rule token by token, per sequence and head (float64):
  S <- exp(g) S;  S <- S + beta k (v - S^T k)^T;  o = S^T q; S restarts (0) at each document's
  first token (a change of segment id). Returns (o [B, T, H, dv], final S [B, H, dk, dv])."""
  B, T, H, dk = q_BxTxHxk.shape
  dv = v_BxTxHxv.shape[-1]
  S = (np.zeros((B, H, dk, dv)) if state_BxHxkxv is None
       else np.array(state_BxHxkxv, np.float64))
  o = np.zeros((B, T, H, dv))
  for b in range(B):
    for t in range(T):
      restart = (segment_ids_BxT is not None and t > 0
                 and segment_ids_BxT[b, t] != segment_ids_BxT[b, t - 1])
      for h in range(H):
        if restart:
          S[b, h] = 0.0
        S[b, h] *= np.exp(g_BxTxH[b, t, h])
        k, v, q = k_BxTxHxk[b, t, h], v_BxTxHxv[b, t, h], q_BxTxHxk[b, t, h]
        S[b, h] += np.outer(k, beta_BxTxH[b, t, h] * (v - S[b, h].T @ k))
        o[b, t, h] = S[b, h].T @ q
  return o, S


def deltanet_layer(p, x_BxTxD, segment_ids_BxT=None, norm_eps=1e-6, cache=None):
  """One Gated DeltaNet layer from its parameters `p` (deltanet.py's names: wq, wk [D, Kh, dk],
  wv, wz [D, Hv, dv], wb, wa [D, Hv], conv_q / conv_k / conv_v [W, heads, dim], A_log,
  dt_bias [Hv], norm.scale [dv], wo [Hv, dv, D]). Value head j reads key head j // (Hv / Kh).
  `cache`: {'conv_q', 'conv_k', 'conv_v' [B, W-1, heads, dim] (the inputs before the window),
  'state' [B, Hv, dk, dv]} or None. Returns (out [B, T, D], the cache after the window)."""
  x = np.asarray(x_BxTxD, np.float64)
  B, T, _ = x.shape
  Kh, dk = p['wq'].shape[1:]
  Hv, dv = p['wv'].shape[1:]
  W = p['conv_q'].shape[0]
  cache = cache or {}
  new_cache = {}

  def conv(name, w):
    y = np.einsum('btd,d...->bt...', x, w)
    shape = y.shape
    flat = y.reshape(B, T, -1)
    past = cache.get(name)
    past_flat = None if past is None else np.asarray(past, np.float64).reshape(B, W - 1, -1)
    full = np.concatenate([np.zeros((B, W - 1, flat.shape[-1])) if past is None else past_flat,
                           flat], axis=1)
    new_cache[name] = full[:, -(W - 1):].reshape((B, W - 1) + shape[2:])
    out = short_conv(flat, p[name].reshape(W, -1), segment_ids_BxT, past_flat)
    return silu(out).reshape(shape)

  q, k, v = conv('conv_q', p['wq']), conv('conv_k', p['wk']), conv('conv_v', p['wv'])
  z = np.einsum('btd,dhv->bthv', x, p['wz'])
  beta = sigmoid(np.einsum('btd,dh->bth', x, p['wb']))
  g = -np.exp(p['A_log']) * softplus(np.einsum('btd,dh->bth', x, p['wa']) + p['dt_bias'])
  G = Hv // Kh
  q = np.repeat(l2_normalize(q) / np.sqrt(dk), G, axis=2)
  k = np.repeat(l2_normalize(k), G, axis=2)
  o, S = gated_delta_rule(q, k, v, g, beta, cache.get('state'), segment_ids_BxT)
  new_cache['state'] = S
  y = rms_norm(o, p['norm']['scale'], norm_eps) * silu(z)
  return np.einsum('bthv,hvd->btd', y, p['wo']), new_cache


# --------------------------------------------------------------------------------------------
# Attention layer, block, model
# --------------------------------------------------------------------------------------------

def attention_layer(p, x_BxTxD, positions_BxT, m):
  """One attention sublayer. `p`: the layer's 'attn' parameters; `m`: the model config dict.

  Returns (output [B, T, D], extras) with extras: probs [B, H, T, T], the SDPA output before
  and after the G1 hook, and the gate scores (for kind 'gate').
  """
  spec = dict(GATE_DEFAULTS, **dict(m.get('gate', {})))
  gp = p.get('gate', {})
  g = lambda hook, y: gate_apply(spec, gp, hook, y, x_BxTxD)  # noqa: E731
  x = np.asarray(x_BxTxD, np.float64)
  q = np.einsum('btd,dhk->bthk', x, p['wq'])
  k = np.einsum('btd,dhk->bthk', x, p['wk'])
  v = np.einsum('btd,dhk->bthk', x, p['wv'])
  q, k, v = g('q', q), g('k', k), g('v', v)
  if m['qk_norm']:
    q = rms_norm(q, _norm_scale(p['q_norm'], m), m['norm_eps'])
    k = rms_norm(k, _norm_scale(p['k_norm'], m), m['norm_eps'])
  rot = int(round(m['head_dim'] * m.get('rope_fraction', 1.0)))   # partial RoPE: first dims
  inv_freq, mscale = rope_parameters(rot, m['rope_base'], m.get('rope_scaling'))
  q = np.concatenate([apply_rope(q[..., :rot], positions_BxT, inv_freq, mscale), q[..., rot:]],
                     axis=-1)
  k = np.concatenate([apply_rope(k[..., :rot], positions_BxT, inv_freq, mscale), k[..., rot:]],
                     axis=-1)
  q, k = g('q_rope', q), g('k_rope', k)
  y, probs = causal_gqa_attention(q, k, v)
  y_gated = g('sdpa', y)
  out = np.einsum('bthk,hkd->btd', y_gated, p['wo'])
  out = g('out', out)
  extras = {'probs': probs, 'y_pre_gate': y, 'y_post_gate': y_gated}
  if spec['position'] != 'none' and spec['kind'] == 'gate':
    extras['gate_scores'] = gate_scores(spec, gp, x)
  return out, extras


def _norm_scale(p, m):
  """An RMSNorm's multiplier: its scale, or 1 + scale when zero-centred (Qwen3-Next)."""
  return 1.0 + p['scale'] if m.get('norm_zero_centered') else p['scale']


def block(p, h_BxTxD, positions_BxT, m):
  """One block: attention (p['attn']) or, in a hybrid's linear_attention layer, a Gated DeltaNet
  (p['linear_attn']); then the SwiGLU FFN."""
  eps = m['norm_eps']
  x = rms_norm(h_BxTxD, _norm_scale(p['attn_norm'], m), eps)
  if 'linear_attn' in p:
    attn_out, _ = deltanet_layer(p['linear_attn'], x, norm_eps=eps)
    extras = {}
  else:
    attn_out, extras = attention_layer(p['attn'], x, positions_BxT, m)
  if m['sandwich_norm']:
    attn_out = rms_norm(attn_out, _norm_scale(p['attn_post_norm'], m), eps)
  h = h_BxTxD + attn_out
  ffn = p['ffn']
  ffn_out = swiglu(rms_norm(h, _norm_scale(p['ffn_norm'], m), eps), ffn['wi_gate'], ffn['wi_up'],
                   ffn['wo'])
  if m['sandwich_norm']:
    ffn_out = rms_norm(ffn_out, _norm_scale(p['ffn_post_norm'], m), eps)
  h_out = h + ffn_out
  extras.update(attn_out=attn_out, attn_residual=h, ffn_out=ffn_out, ffn_residual=h_out)
  return h_out, extras


def forward(params, tokens_BxT, m):
  """Logits [B, T, V] (float64) and a list of per-layer extras (see `block`). A hybrid
  (m['layer_types'] with linear_attention layers) stacks its blocks by period: layer l is
  params['blocks']['layer_<l % P>'] at index l // P, P the pattern's period."""
  tokens = np.asarray(tokens_BxT)
  B, T = tokens.shape
  positions = np.broadcast_to(np.arange(T), (B, T))
  h = embed(params['embed']['embedding'], tokens)
  types = tuple(m.get('layer_types') or ())
  period = len([k for k in params['blocks'] if k.startswith('layer_')]) if (
      'linear_attention' in types) else None
  per_layer = []
  for i in range(m['num_layers']):
    p = (layer(params['blocks'], i) if period is None
         else layer(params['blocks'][f'layer_{i % period}'], i // period))
    h, extras = block(p, h, positions, m)
    per_layer.append(extras)
  h = rms_norm(h, _norm_scale(params['final_norm'], m), m['norm_eps'])
  if m['tie_embeddings']:
    logits = h @ params['embed']['embedding'].T
  else:
    logits = h @ params['lm_head']
  return logits, per_layer


def streaming_forward(params, tokens_T, m, window, sinks):
  """Logits [T, V] (float64) of one sequence decoded token by token through a StreamingLLM
  cache (Xiao et al. 2023): the query at position p sees the first `sinks` tokens and the last
  `window` (p included); each layer keeps, per token, the key (before RoPE) and value computed
  when that token was decoded, evicting a token once it leaves the window; the kept tokens, in
  text order, take RoPE positions 0, 1, ... by their rank. Written from that definition with
  python lists, independently of gated_attention/model/kv_cache.py's ring arithmetic."""
  spec = dict(GATE_DEFAULTS, **dict(m.get('gate', {})))
  inv_freq, mscale = rope_parameters(m['head_dim'], m['rope_base'], m.get('rope_scaling'))
  eps, L = m['norm_eps'], m['num_layers']
  G = m['num_heads'] // m['num_kv_heads']
  caches = [dict() for _ in range(L)]     # per layer: {position: (raw key [K, d], value [K, d])}
  out = []
  for p, token in enumerate(np.asarray(tokens_T)):
    h = embed(params['embed']['embedding'], np.array([[token]]))           # [1, 1, D]
    for i in range(L):
      lp = layer(params['blocks'], i)
      ap, gp = lp['attn'], lp['attn'].get('gate', {})
      x = rms_norm(h, lp['attn_norm']['scale'], eps)
      g = lambda hook, y, x=x, gp=gp: gate_apply(spec, gp, hook, y, x)  # noqa: E731
      q = g('q', np.einsum('btd,dhk->bthk', x, ap['wq']))
      k = g('k', np.einsum('btd,dhk->bthk', x, ap['wk']))
      v = g('v', np.einsum('btd,dhk->bthk', x, ap['wv']))
      if m['qk_norm']:
        q = rms_norm(q, ap['q_norm']['scale'], eps)
        k = rms_norm(k, ap['k_norm']['scale'], eps)
      caches[i][p] = (k[0, 0], v[0, 0])
      for old in [j for j in caches[i] if sinks <= j <= p - window]:       # evicted
        del caches[i][old]
      kept = sorted(caches[i])
      assert len(kept) <= sinks + window
      place = {j: r for r, j in enumerate(kept)}
      keys = np.stack([caches[i][j][0] for j in kept])[None]                # [1, n, K, d]
      keys = apply_rope(keys, np.array([[place[j] for j in kept]]), inv_freq, mscale)
      values = np.stack([caches[i][j][1] for j in kept])                     # [n, K, d]
      q = g('q_rope', apply_rope(q, np.array([[place[p]]]), inv_freq, mscale))
      y = np.zeros(q.shape)
      for hh in range(m['num_heads']):
        s_n = keys[0, :, hh // G] @ q[0, 0, hh] / math.sqrt(m['head_dim'])
        y[0, 0, hh] = softmax(s_n) @ values[:, hh // G]
      attn_out = g('out', np.einsum('bthk,hkd->btd', g('sdpa', y), ap['wo']))
      if m['sandwich_norm']:
        attn_out = rms_norm(attn_out, lp['attn_post_norm']['scale'], eps)
      h = h + attn_out
      ffn = lp['ffn']
      ffn_out = swiglu(rms_norm(h, lp['ffn_norm']['scale'], eps), ffn['wi_gate'], ffn['wi_up'],
                       ffn['wo'])
      if m['sandwich_norm']:
        ffn_out = rms_norm(ffn_out, lp['ffn_post_norm']['scale'], eps)
      h = h + ffn_out
    h = rms_norm(h, params['final_norm']['scale'], eps)
    head = params['embed']['embedding'].T if m['tie_embeddings'] else params['lm_head']
    out.append((h @ head)[0, 0])
  return np.stack(out)


def f_attn_per_head(probs_BxHxTxT):
  """F-Attn per head: probability on token 0, averaged over batch and queries 1..T-1."""
  return probs_BxHxTxT[:, :, 1:, 0].mean(axis=(0, 2))


# --------------------------------------------------------------------------------------------
# Test support (no jax): the variant configs
# --------------------------------------------------------------------------------------------

def variant_names():
  """The variants: configs/*.py but base.py and the run-derived from_run.py, extend_context.py."""
  import pathlib  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(__file__).resolve().parent.parent / 'configs'
  return sorted(p.stem for p in root.glob('*.py')
                if p.stem not in ('__init__', 'base', 'from_run', 'extend_context'))


def gated_variant_names():
  return [n for n in variant_names() if not n.startswith('baseline')]


def load_config(name, scale='tiny'):
  import importlib  # pylint: disable=g-import-not-at-top
  return importlib.import_module(f'configs.{name}').get_config(scale)


def tiny_model_config(name, **overrides):
  """The variant's model config at scale 'tiny', shrunk to TINY_MODEL (+ overrides).

  Head counts that the variant changes relative to the base config (baseline_more_q_heads,
  baseline_more_kv_heads) keep the variant's ratio: 4 -> 6 query heads, 2 -> 4 KV heads.
  """
  from fractions import Fraction  # pylint: disable=g-import-not-at-top
  base_m = load_config('baseline', 'tiny').model
  m = load_config(name, 'tiny').model
  shapes = dict(TINY_MODEL)
  for field in ('num_heads', 'num_kv_heads'):
    ratio = Fraction(m[field], base_m[field])
    shapes[field] = int(shapes[field] * ratio)
  m.update(dict(shapes, **overrides))
  return m
