"""Device mesh, logical-axis rules and the shardings of state and batch.

The model names every parameter axis logically (`vocab`, `embed`, `heads`, ...); a rule table
from the config maps those names onto the mesh axes `data`, `fsdp` and `tensor`. Changing the
parallelism is a config change: a 1-device mesh is just a mesh.

Rules are tried in order and a mesh axis is used at most once per array, so activations
(`batch`, `length`, `embed`) shard their batch over (data, fsdp) and leave `embed` whole,
while parameters shard `embed` over fsdp.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')

# t5x/MaxText-style table: FSDP shards `embed`, tensor parallelism shards heads, mlp, vocab.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ('batch', BATCH_AXES),
    ('vocab', 'tensor'),
    ('heads', 'tensor'),
    ('mlp', 'tensor'),
    ('embed', 'fsdp'),
    ('kv', None),
    ('length', None),
    ('layers', None),
    ('norm', None),
    ('position', None),
    ('token_type', None),
)


def mesh_shape(shape: Mapping[str, int] | Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Resolve one -1 entry to 'the rest of the devices' and check the product."""
  dims = [int(shape[a]) for a in MESH_AXES] if isinstance(shape, Mapping) else list(shape)
  if len(dims) != len(MESH_AXES):
    raise ValueError(f'config.mesh needs {len(MESH_AXES)} sizes {MESH_AXES}, got {dims}')
  if dims.count(-1) > 1:
    raise ValueError(f'config.mesh={dims}: at most one axis may be -1')
  known = math.prod(d for d in dims if d != -1)
  if -1 in dims:
    if num_devices % known:
      raise ValueError(f'config.mesh={dims}: {num_devices} devices are not divisible by {known}')
    dims[dims.index(-1)] = num_devices // known
  if math.prod(dims) != num_devices:
    raise ValueError(f'config.mesh={dims} has {math.prod(dims)} slots for {num_devices} devices; '
                     'use -1 for one axis to take the rest')
  return tuple(dims)


def make_mesh(shape: Mapping[str, int] | Sequence[int], devices=None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  dims = mesh_shape(shape, len(devices))
  try:
    grid = mesh_utils.create_device_mesh(dims, devices, allow_split_physical_axes=True)
  except (NotImplementedError, ValueError, AssertionError):
    grid = np.asarray(devices).reshape(dims)  # CPU and unknown topologies
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def normalize_rules(rules) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
  """Config rules (lists from ml_collections) as the tuples Flax expects; empty (a config's
  default): DEFAULT_RULES."""
  out = []
  rules = rules or DEFAULT_RULES
  for name, axes in rules:
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
      for a in axes:
        if a not in MESH_AXES:
          raise ValueError(f'config.sharding_rules: {name!r} -> unknown mesh axis {a!r}; '
                           f'mesh axes are {MESH_AXES}')
    elif axes is not None and axes not in MESH_AXES:
      raise ValueError(f'config.sharding_rules: {name!r} -> unknown mesh axis {axes!r}; '
                       f'mesh axes are {MESH_AXES}')
    out.append((name, axes))
  return tuple(out)


def logical_to_sharding(logical_specs, mesh: Mesh, rules, shapes=None):
  """Tree of logical PartitionSpecs -> tree of NamedShardings on `mesh`.

  With `shapes` (a matching tree of arrays or ShapeDtypeStructs), a dimension that its mesh
  axes do not divide (vocab 30522 over 4 devices, say) is replicated instead of failing.
  """
  shardings = nn.logical_to_mesh_sharding(logical_specs, mesh, normalize_rules(rules))
  if shapes is None:
    return shardings
  return jax.tree_util.tree_map(
      lambda sh, x: NamedSharding(mesh, divisible_spec(sh.spec, x.shape, mesh)),
      shardings, shapes, is_leaf=lambda x: isinstance(x, NamedSharding))


def divisible_spec(spec: P, shape: Sequence[int], mesh: Mesh) -> P:
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[a] for a in names)
    out.append(axes if dim % size == 0 else None)
  return P(*out)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's rows -> global arrays sharded over (data, fsdp), in one batched transfer
  (0.20 ms for a 9-feature batch of 4 x 128 on the CPU backend, 0.33 ms key by key)."""
  return jax.make_array_from_process_local_data(
      batch_sharding(mesh), {k: np.asarray(v) for k, v in local.items()})


@contextlib.contextmanager
def activate(mesh: Mesh, rules):
  """Mesh and rules in scope, so `nn.with_logical_constraint` inside jit takes effect."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(normalize_rules(rules)):
    yield
