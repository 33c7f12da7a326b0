# -- torch.optim.Muon (torch/optim/_muon.py) ------------------------------------------------------


def _bfloat16(x: np.ndarray) -> np.ndarray:
  """``x`` (float64 or float32) rounded to bfloat16 (nearest even, through float32 as c10's
  conversion), kept as float64."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _muon_newton_schulz(update, ns_coefficients, ns_steps, eps):
  """PyTorch's ``_zeropower_via_newtonschulz`` with every bfloat16 result correctly rounded: each
  matrix product (of bfloat16 numbers, exact products) and ``b A + c A A``, ``a X + B X`` summed in
  float64 and rounded once to bfloat16 (PyTorch accumulates in float32: the two differ only where
  float32's sum lands across a bfloat16 rounding boundary)."""
  a, b, c = (float(np.float32(v)) for v in ns_coefficients)
  x = _bfloat16(update)
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  norm = _bfloat16(np.sqrt(np.sum(x * x)))
  norm = max(norm, float(_bfloat16(np.float64(eps))))
  x = _bfloat16(x / norm)
  for _ in range(ns_steps):
    gram = _bfloat16(x @ x.T)
    gram_update = _bfloat16(b * gram + c * (gram @ gram))
    x = _bfloat16(a * x + gram_update @ x)
  return x.T if tall else x


@expectation("pytorch_muon", state=1)
def pytorch_muon(
  lr,
  count,
  X,
  G,
  momentum_buffer,
  *,
  weight_decay,
  momentum,
  nesterov,
  ns_coefficients=(3.4445, -4.7750, 2.0315),
  eps=1e-7,
  ns_steps=5,
  adjust_lr_fn=None,
  dtype=np.float64,
  scalars=None,
):
  """``torch.optim.Muon``'s step on one matrix (written from PyTorch's ``_single_tensor_muon``).

  The iteration's input is formed as PyTorch forms it, in the tensors' own dtype (float32 for
  float32, bfloat16 and float16 tensors' opmath, float64 for float64): ``buf.lerp_(grad, 1 -
  momentum)``, ``grad.lerp(buf, momentum)`` (one fused rounding each, PyTorch's two branches);
  the iteration is :func:`_muon_newton_schulz`; ``X_new`` is computed in ``dtype``. Returns
  ``(X_new, momentum_buffer_new)``.
  """
  del count, scalars
  work = np.float64 if np.asarray(G).dtype == np.float64 else np.float32
  g, buf = (np.asarray(v, work) for v in (G, momentum_buffer))

  def lerp(start, end, weight):
    w = work(weight)
    if abs(w) < 0.5:
      return _fma(w, end - start, start, work)
    return _fma(w - work(1), end - start, end, work)

  buf = np.asarray(lerp(buf, g, 1 - momentum), work)
  update = np.asarray(lerp(g, buf, momentum), work) if nesterov else buf
  ortho = _muon_newton_schulz(update, ns_coefficients, ns_steps, eps)
  A, B = np.shape(X)
  ratio = math.sqrt(max(1, A / B)) if adjust_lr_fn in (None, "original") else 0.2 * math.sqrt(max(A, B))
  (X,) = _arrays(dtype, X)
  if weight_decay != 0:
    X = X * np.asarray(1 - lr * weight_decay, X.dtype)  # param.mul_(1 - lr * weight_decay)
  X_new = X + np.asarray(-(lr * ratio), X.dtype) * ortho.astype(X.dtype)  # add_(update, alpha=-lr*ratio)
  return X_new, buf.astype(dtype if dtype is not None else work)
