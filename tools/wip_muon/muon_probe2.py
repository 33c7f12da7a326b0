import torch, numpy as np, jax, jax.numpy as jnp
from torch.optim._muon import _zeropower_via_newtonschulz as ns_t
def ns_j(g, coeffs=(3.4445, -4.7750, 2.0315), steps=5, eps=1e-7):
    a, b, c = coeffs
    x = g.astype(jnp.bfloat16)
    tr = g.shape[0] > g.shape[1]
    if tr: x = x.T
    f = x.astype(jnp.float32)
    nrm = jnp.sqrt(jnp.sum(f * f)).astype(jnp.bfloat16)
    nrm = jnp.maximum(nrm, jnp.asarray(eps, jnp.bfloat16))
    x = (f / nrm.astype(jnp.float32)).astype(jnp.bfloat16)
    for _ in range(steps):
        gm = jnp.dot(x, x.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        gu = (jnp.float32(c) * jnp.dot(gm, gm, preferred_element_type=jnp.float32) + jnp.float32(b) * gm.astype(jnp.float32)).astype(jnp.bfloat16)
        x = (jnp.dot(gu, x, preferred_element_type=jnp.float32) + jnp.float32(a) * x.astype(jnp.float32)).astype(jnp.bfloat16)
    return x.T if tr else x
f = jax.jit(ns_j)
rng = np.random.default_rng(0)
for dt in (np.float32, np.float64):
  for (m, n) in [(4,3),(2,4),(1,2),(3,5),(5,3),(13,1),(8,8),(16,64),(64,16),(32,128),(128,256),(256,256)]:
    tot = 0; elems = 0; maxd = 0.0
    for t in range(10 if m*n < 5000 else 2):
        g = rng.standard_normal((m, n)).astype(dt)
        if t == 1: g *= 1e-30
        o_t = ns_t(torch.from_numpy(g), (3.4445, -4.7750, 2.0315), 5, 1e-7).float().numpy()
        with jax.enable_x64(dt == np.float64):
            o_j = np.asarray(f(jnp.asarray(g)).astype(jnp.float32))
        d = o_t != o_j
        tot += int(d.sum()); elems += d.size
        maxd = max(maxd, float(np.max(np.abs(o_t - o_j))))
    print(dt.__name__, (m, n), "mismatched", tot, "/", elems, "max|diff|", maxd)
