"""The sentence-embedding kind end to end as a user runs it: `python -m bert_jax.finetune
--config=configs/finetune.py:embedding` on the Inverse Cloze pair set made from this machine's
docstrings (input_pipeline/finetune/pairs.py), from a ModernBERT start point (CLS pooling,
the cached Matryoshka loss); scored by retrieval next to BM25, exported as a
sentence-transformers directory that embeds as the run's own predict step does; and an
exported model read back as a start point. A BERT start point's run step on a data-parallel
mesh against one device."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf_modern, start_points
from bert_jax.finetune import kinds, program, run as finetune
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training import sharding as shd
from configs import common, finetune as finetune_configs
from input_pipeline.finetune import batching, pairs
from input_pipeline.tokenizer import WordPieceTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


@pytest.fixture(scope='module')
def pair_files(tmp_path_factory):
  d = tmp_path_factory.mktemp('pairs')
  return pairs.write_demo_pairs(str(d), None, source='docstrings', train_pairs=96,
                               eval_queries=24)


@pytest.fixture(scope='module')
def bert_start(tmp_path_factory) -> str:
  """A random one-layer BertModel (an encoder without heads) saved by transformers: the start
  point of the command and of the data-parallel loss (nothing here depends on depth, and each
  layer is compiled anew)."""
  directory = tmp_path_factory.mktemp('bert')
  torch.manual_seed(0)
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  hf_cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=128)
  transformers.BertModel(hf_cfg).save_pretrained(directory)
  tok.save_pretrained(directory)
  return str(directory)


def modern_start(directory) -> str:
  torch.manual_seed(0)
  tok = WordPieceTokenizer(VOCAB, do_lower_case=True)
  cfg = BertConfig.from_preset('tiny', arch='modern', vocab_size=tok.vocab_size, num_layers=2,
                               local_window=16)  # a global layer and a local one
  hf_config = {k: v for k, v in hf_modern.config_to_hf(cfg).items()
               if k not in ('architectures', 'model_type')}
  transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**hf_config)).save_pretrained(
      directory)
  tok.save_pretrained(directory)
  return str(directory)


def test_the_embedding_command_trains_scores_against_bm25_and_exports(pair_files, tmp_path):
  """The command from a ModernBERT start point, with CLS pooling and the cached loss (4
  chunks of 8 rows) summed over Matryoshka dimensions (128, 32): dev and test scored next to
  BM25 (dev at both dimensions), the loss falls, and the export embeds as the run's own
  predict step does."""
  start = modern_start(tmp_path / 'modern')
  workdir = tmp_path / 'run'
  out = subprocess.run(
      [sys.executable, '-m', 'bert_jax.finetune', '--config=configs/finetune.py:embedding',
       f'--init={start}', f'--workdir={workdir}', f'--config.data.train_file={pair_files["train"]}',
       f'--config.data.dev_file={pair_files["dev"]}',
       f'--config.data.test_file={pair_files["test"]}', '--config.data.pooling=cls',
       '--config.data.embed_chunk=8', '--config.data.matryoshka_dims=(128,32)',
       '--config.data.max_seq_length=64', '--config.train.global_batch_size=32',
       '--config.train.num_epochs=2', '--config.optimizer.learning_rate=1e-3'],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  results = json.loads((workdir / 'results.json').read_text())
  assert results['baseline_kind'] == 'BM25' and results['complete']
  dev = results['splits']['dev']
  assert dev['headline_metric'] == 'ndcg@10'
  assert set(dev['baseline']) >= {'recall@1', 'recall@10', 'mrr@10', 'ndcg@10'}
  assert dev['baseline']['ndcg@10'] > 0.5  # the ICT queries share words with their passages
  history = results['runs'][0]['history']
  assert [h['epoch'] for h in history] == [1, 2] and history[1]['train_loss'] < history[0][
      'train_loss'] and history[0]['train_loss'] > 0
  assert 'test ndcg@10=' in out.stderr + out.stdout and '(BM25 baseline' in out.stderr
  scores = history[0]['scores']['dev']
  assert 0 < scores['ndcg@10@32d'] <= 1 and 'ndcg@10@128d' not in scores  # 128: the plain ones

  export = str(workdir / 'hf_export')
  st = pytest.importorskip('sentence_transformers').SentenceTransformer(export, device='cpu')
  assert st.max_seq_length == 64
  texts = ['the module defines a class', 'Return the number of items.', 'x']
  theirs = st.encode(texts, convert_to_numpy=True)
  # The run's own predict step on its exported weights (via the export read as a start point).
  c = finetune_configs.get_config('embedding')
  c = common.override(c, {'init': export, 'data.max_seq_length': 64, 'data.pooling': 'cls'})
  loaded = finetune.load_start(c)
  assert loaded.head is None and loaded.cfg.hidden_size == 128 and loaded.cfg.arch == 'modern'
  kind = kinds.get('sentence_embedding').configure(c.data)
  head = kind.make_head((), None)
  assert head.pooling == 'cls'
  _, params = start_points.init_head_params(loaded, head)
  arrays, _ = kind.featurize(pairs.RetrievalSplit(texts, [], []), (), loaded.tokenizer, c.data,
                             training=False)
  ours = jax.jit(heads.build_model(loaded.cfg, head).apply)(
      {'params': params}, arrays['input_ids'], arrays['input_mask'], arrays['segment_ids'])
  ours = np.asarray(ours)[:, 0]
  cosine = np.sum(ours * theirs, -1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(
      theirs, axis=-1)
  assert np.max(1 - cosine) <= 1e-5, 1 - cosine


@pytest.mark.multi_device
def test_the_contrastive_loss_spans_the_global_batch_on_a_data_parallel_mesh(pair_files,
                                                                               bert_start):
  """The run's own jitted step on 2 data-parallel devices gives the loss of 1 device with
  the whole batch: every device's rows are every query's negatives."""
  c = finetune_configs.get_config('embedding')
  c = common.override(c, {'init': bert_start,
                          'data.train_file': pair_files['train'],
                          'data.dev_file': pair_files['dev'],
                          'data.max_seq_length': 32, 'model.hidden_dropout': 0.0,
                          'model.attention_dropout': 0.0})
  start = finetune.load_start(c)
  task = finetune.build_task(c, start)
  _, params = start_points.init_head_params(start, task.head, jax.random.key(0))
  rows = np.arange(16)
  rows[-3:] = -1  # a padded last batch
  local = batching.take(task.train, rows, task.kind.schema().names)
  losses = []
  for devices in (jax.devices()[:1], jax.devices()[:2]):
    setup = program.setup_for(c, start.cfg, task.head, task.kind, 10, devices)
    assert setup.mesh.shape['data'] == len(devices)
    state = setup.state_from_params(params, 0)
    _, metrics = setup.train_step()(state, shd.global_batch(local, setup.mesh))
    losses.append(float(metrics['loss']))
  assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0] > 0
