"""One persistent-cache key for a program on every process of a CPU pod the tests start.

JAX keys its compilation cache partly by the devices' topology fingerprint, and on CPU that
fingerprint differs between the processes of one `jax.distributed` job; only process 0 writes
entries, so process 1 of every local_pod.sh run recompiled every program the earlier runs had
already compiled (a second 2-process BERT-tiny launch: 62 CPU-s without this, 26 with it). The
key's other parts (the program, compile options, device assignment, flags, versions) are
unchanged, and the executable is the same program for every process (JAX strips the device
assignment from the key on GPU for this reason). Tests compare such runs bit for bit against one
process, which would catch an executable that was not.

With one key on every process, the processes of a pod also share the compile itself:
JAX_SHARE_BINARY_BETWEEN_HOSTS (set here, unless the environment says otherwise) makes process 0
compile each program that spans the processes and hand the executable to the others through
jax.distributed's key-value store, where each process would otherwise compile it at the same
time (a cold 2-process BERT-tiny launch: 39 CPU-s with it, 50-60 without). It waits on that key,
which only a key equal on every process makes safe: not for users' pods.

tests/cpu_env.py puts this directory on PYTHONPATH of every process the suite starts. The hook
waits for jax._src.cache_key to be imported (most of those processes never import JAX), and
changes only keys of programs whose CPU devices span several processes."""

import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault('JAX_SHARE_BINARY_BETWEEN_HOSTS', 'true')


def _patch(cache_key):
  by_topology = cache_key._hash_accelerator_config  # pylint: disable=protected-access

  def hash_accelerator_config(hash_obj, accelerators):
    devices = list(accelerators.flat)
    if len({d.process_index for d in devices}) > 1 and all(d.platform == 'cpu' for d in devices):
      return cache_key._hash_devices(hash_obj, accelerators)  # pylint: disable=protected-access
    return by_topology(hash_obj, accelerators)

  cache_key._hash_accelerator_config = hash_accelerator_config  # pylint: disable=protected-access


class _OnImport(importlib.abc.MetaPathFinder):

  def find_spec(self, name, path, target=None):
    if name != 'jax._src.cache_key':
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      _patch(module)

    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _OnImport())
