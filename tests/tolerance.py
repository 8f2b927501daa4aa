"""Float32 comparisons whose bound scales with the magnitude of what is compared.

XLA picks different CPU kernels on AVX2 and AVX-512 machines (and different fusions with
rematerialisation), so float32 sums are accumulated in different orders. Round-off in a sum is
a fraction of the magnitude of its *terms*, not of its result: a gradient entry of 0.17 built
from terms of size 100 carries errors of ~1e-5, which a fixed `atol` calls a failure on one CPU
kind and not the other. The bound here is `rtol * max|desired|` over the whole compared tree,
the scale at which those terms live, so a test fails only on a real numerical difference.
"""

import jax
import numpy as np


def tree_scale(tree) -> float:
  return max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree_util.tree_leaves(tree))


def assert_trees_close(actual, desired, rtol: float = 1e-6) -> None:
  """Every leaf within rtol times the largest magnitude anywhere in `desired`."""
  bound = rtol * tree_scale(desired)

  def check(path, a, d):
    err = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(d, np.float64))))
    assert err <= bound, (f'{jax.tree_util.keystr(path)}: max |diff| {err:.3g} > {bound:.3g} '
                          f'(= {rtol:g} x max |desired| over the tree)')

  jax.tree_util.tree_map_with_path(check, actual, desired)
