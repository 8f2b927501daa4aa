"""The CPU malloc settings: set once by re-execution, kept where the user set them, effective."""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from bert_jax.training import host_malloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='glibc tunables')

# Faults of touching a 64 MiB buffer freshly malloc'ed after an equal one was freed: with
# glibc's defaults it is mmap'ed anew (16,384 faults of 4 KiB pages); tuned, it is reused.
REUSE_PROBE = textwrap.dedent("""
    import ctypes, json, os, resource, sys
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 20
    def touch():
      p = libc.malloc(size)
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      ctypes.memset(p, 1, size)
      faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
      libc.free(p)
      return faults
    touch()
    print(json.dumps({'faults': touch(), 'pid': os.getpid(), 'argv': sys.argv[1:],
                      'tunables': os.environ.get('GLIBC_TUNABLES')}))
""")


def run_probe(tmp_path, env, *args, reexec: bool):
  script = tmp_path / 'probe.py'
  prelude = ('from bert_jax.training import host_malloc\nhost_malloc.reexec_with_tuned_malloc()\n'
             if reexec else '')
  script.write_text(prelude + REUSE_PROBE)
  env = dict(env, PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, str(script), *args], env=env, check=True,
                       capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def untuned_env():
  return {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}


@glibc_only
def test_reexecuted_process_reuses_freed_memory(tmp_path):
  if host_malloc.accelerator_attached():
    pytest.skip('the settings are not applied next to an accelerator')
  plain = run_probe(tmp_path, untuned_env(), reexec=False)
  tuned = run_probe(tmp_path, untuned_env(), '--flag=1', 'x', reexec=True)
  assert plain['tunables'] is None and plain['faults'] > 10_000
  assert tuned['tunables'] == host_malloc.TUNABLES
  assert tuned['argv'] == ['--flag=1', 'x']
  assert tuned['faults'] < 100, tuned


@glibc_only
def test_a_users_own_setting_is_kept(tmp_path):
  env = dict(untuned_env(), GLIBC_TUNABLES='')
  result = run_probe(tmp_path, env, reexec=True)
  assert result['tunables'] == ''
  assert not host_malloc.wanted(env)


def test_not_applied_next_to_an_accelerator(tmp_path, monkeypatch):
  (tmp_path / 'accel0').write_text('')
  monkeypatch.setattr(host_malloc, 'ACCELERATOR_DEVICES', (str(tmp_path / 'accel[0-9]*'),))
  assert host_malloc.accelerator_attached()
  assert not host_malloc.wanted(untuned_env())
  assert 'GLIBC_TUNABLES' not in host_malloc.tuned_environ(untuned_env())


@glibc_only
def test_command_runner_sets_the_environment():
  if host_malloc.accelerator_attached():
    pytest.skip('the settings are not applied next to an accelerator')
  out = subprocess.run([sys.executable, '-m', 'bert_jax.training.host_malloc', sys.executable, '-c',
                        'import os; print(os.environ["GLIBC_TUNABLES"])'],
                       env=dict(untuned_env(), PYTHONPATH=ROOT), check=True,
                       capture_output=True, text=True, cwd=ROOT).stdout
  assert out.strip() == host_malloc.TUNABLES


def test_command_runner_names_a_command_it_cannot_run():
  out = subprocess.run([sys.executable, '-m', 'bert_jax.training.host_malloc', 'no-such-command-xyz'],
                       env=dict(untuned_env(), PYTHONPATH=ROOT), capture_output=True, text=True,
                       cwd=ROOT)
  assert out.returncode != 0
  assert "cannot run 'no-such-command-xyz'" in out.stderr and 'Traceback' not in out.stderr


# A 256 MiB block freed under the tuned settings stays resident; `trim_if_over` gives it back
# once the process holds more than its limit, and leaves it kept below that.
TRIM_PROBE = textwrap.dedent("""
    import ctypes, json, sys
    from bert_jax.training import host_malloc
    host_malloc.reexec_with_tuned_malloc()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 256 << 20
    small = libc.malloc(1 << 20)  # a live block above the big one's start keeps the heap's top
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    guard = libc.malloc(1 << 20)  # ... and one after it: freed, the big block is mid-heap
    ctypes.memset(guard, 1, 1 << 20)
    libc.free(p)
    held = host_malloc.resident_bytes()
    above = host_malloc.trim_if_over(held + (64 << 20))  # under its limit: kept
    kept = host_malloc.resident_bytes()
    trimmed = host_malloc.trim_if_over(held - (128 << 20))  # over it: returned
    print(json.dumps({'held': held, 'kept': kept, 'after': host_malloc.resident_bytes(),
                      'above': above, 'trimmed': trimmed,
                      'default_limit': host_malloc._trim_limit()}))
""")


@glibc_only
def test_trim_if_over_returns_kept_memory_only_above_its_limit(tmp_path):
  if host_malloc.accelerator_attached():
    pytest.skip('the settings are not applied next to an accelerator')
  script = tmp_path / 'trim.py'
  script.write_text(TRIM_PROBE)
  out = subprocess.run([sys.executable, str(script)], env=dict(untuned_env(), PYTHONPATH=ROOT),
                       check=True, capture_output=True, text=True).stdout
  r = json.loads(out.strip().splitlines()[-1])
  mib = 1 << 20
  assert not r['above'] and r['kept'] > r['held'] - 16 * mib  # the freed block still resident
  assert r['trimmed'] and r['after'] < r['held'] - 200 * mib, r  # ... given back
  physical = os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  assert r['default_limit'] == int(host_malloc.RESIDENT_SHARE * physical)
