"""Test-wide setup: the emulated CPU devices and the fast compile of tests/cpu_env.py (both must
precede any jax import), a shared compilation cache, and the small pre-training data set most
end-to-end tests train on.

Devices: 8 by default, so that any test runs alone with `pytest tests/test_x.py`. The suite
(scripts/test.sh) runs the tests marked `multi_device` (those that build a mesh of several
devices) in a session with 8, and the rest with BERT_JAX_TEST_DEVICES=1, one device as on a
laptop: on 2 cores a tiny model's step over 8 emulated devices compiles ~40% and runs ~50%
slower, and proves nothing more than on one unless the test compares meshes."""

import os
import tempfile

from cpu_env import with_multihost_cache, xla_flags

DEVICES = int(os.environ.get('BERT_JAX_TEST_DEVICES', '8'))
MULTI_DEVICE = 8  # what a `multi_device` test may ask for
os.environ.setdefault('XLA_FLAGS', xla_flags(DEVICES))
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
# glibc's default malloc for every process the tests start (an empty GLIBC_TUNABLES: the CLIs
# do not re-execute themselves with bert_jax/training/host_malloc.py's one-arena settings). Those
# settings speed a long run's steps; the suite's processes mostly compile, with XLA's compiler
# threads all taking one arena's lock: on the CPU-heavy CLI tests (test_rtd, test_loop,
# test_maintenance) 9% less CPU and 13% less wall time with the defaults. Tests of the tuned
# allocator itself (test_host_malloc.py, the seed memory bound in test_finetune.py) unset it.
os.environ.setdefault('GLIBC_TUNABLES', '')
os.environ.setdefault('TRANSFORMERS_NO_ADVISORY_WARNINGS', '1')
# JAX's persistent compilation cache, shared by both xdist workers and every subprocess the
# tests start (they inherit the environment): the end-to-end tests compile the same few steps
# dozens of times, and a cache hit skips ~10 s of XLA per process. Results are unchanged: a hit
# runs the executable the same HLO compiled to.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), 'bert_jax_tests_xla_cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
# Every process of a CPU pod a test starts reads the entries process 0 wrote
# (tests/multihost_cache/sitecustomize.py).
os.environ['PYTHONPATH'] = with_multihost_cache(os.environ.get('PYTHONPATH'))

import pytest  # noqa: E402


# Seconds each module held a worker in a cold run of the suite (2026-11-29, scripts/test.sh on
# 2 cores; modules under 30 s not named). The workers take modules longest first, so that the
# run does not end on one long module while the other worker idles: xdist's own order is by
# test count, which left test_pod, test_gcs and test_modern_train to the last third. A stale
# figure costs some parallelism, never a result.
MODULE_SECONDS = {
    'test_train.py': 295, 'test_finetune.py': 248, 'test_launch.py': 178,
    'test_attention_impl.py': 172, 'test_aot.py': 169, 'test_pod.py': 129,
    'test_sharding.py': 122, 'test_beam.py': 111, 'test_heads.py': 106, 'test_pipeline.py': 106,
    'test_optim.py': 102, 'test_released_shapes.py': 74, 'test_modern_train.py': 74,
    'test_gcs.py': 71, 'test_rtd.py': 67, 'test_mlm_loss.py': 66, 'test_hf_tokenizers.py': 63,
    'test_model.py': 60, 'test_modern.py': 56, 'test_embedding_task.py': 56,
    'test_start_points.py': 55, 'test_batch_warmup.py': 46, 'test_roberta.py': 38,
    'test_embeddings.py': 38, 'test_grad_cache.py': 35, 'test_electra.py': 35,
}


def pytest_configure(config):
  # Each worker traces and compiles hundreds of steps with torch, TensorFlow and JAX loaded:
  # collect as the CLIs do (bert_jax.training.run_control.fewer_collections says why).
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  run_control.fewer_collections()
  if hasattr(config.option, 'loadscopereorder'):  # xdist: keep MODULE_SECONDS' order
    config.option.loadscopereorder = False
  config.addinivalue_line(
      'markers', f'multi_device: builds a mesh of up to {MULTI_DEVICE} devices (scripts/test.sh '
      'runs these in their own session with that many)')


def pytest_collection_modifyitems(items):
  items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0))  # stable: file order after


def pytest_runtest_setup(item):
  """A multi-device test in a one-device session fails here, saying why, not in its mesh."""
  if item.get_closest_marker('multi_device'):
    import jax  # pylint: disable=g-import-not-at-top
    if jax.device_count() < MULTI_DEVICE:
      pytest.fail(f'{item.nodeid} is marked multi_device and needs {MULTI_DEVICE} devices; this '
                  f'session has {jax.device_count()} (unset BERT_JAX_TEST_DEVICES and XLA_FLAGS, '
                  'or run scripts/test.sh, which runs these with 8)', pytrace=False)


@pytest.fixture(scope='session')
def data(tmp_path_factory):
  """A small corpus -> 2,000-word vocab -> 64-token train (3 shards) and eval records."""
  from input_pipeline.pretrain import corpus, create_pretraining_data as cpd
  from input_pipeline.pretrain.instances import MaskingConfig
  from input_pipeline.tokenizer import WordPieceTokenizer
  d = tmp_path_factory.mktemp('data')
  docs = list(corpus.embedded_documents())[:600]
  corpus.write_text_file(docs[:560], str(d / 'train.txt'))
  corpus.write_text_file(docs[560:], str(d / 'eval.txt'))
  WordPieceTokenizer.train((s for doc in docs for s in doc), 2000, str(d))
  masking = MaskingConfig(max_seq_length=64, max_predictions_per_seq=10)
  for split, shards in (('train', 3), ('eval', 1)):
    cpd.run(cpd.Job(output_file=str(d / split), masking=masking, vocab_file=str(d / 'vocab.txt'),
                    input_file=str(d / f'{split}.txt'), dupe_factor=2, num_shards=shards,
                    window_chars=30_000))
  return d


def pytest_unconfigure(config):
  """A worker's last act: skip the collector's final pass over torch's, TensorFlow's and JAX's
  objects at exit (bert_jax.training.run_control.skip_exit_collection says why)."""
  import gc  # pylint: disable=g-import-not-at-top
  gc.freeze()
