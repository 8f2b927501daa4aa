"""Replaced-token detection (`train.objective=rtd`, bert_jax/pretrain/rtd.py) against
transformers' ELECTRA classes (models/electra/modeling_electra.py): the discriminator's loss is
`ElectraForPreTraining`'s on the same corrupted rows and labels, the generator's
`ElectraForMaskedLM`'s on the same masked rows, plain and packed (a packed row is compared
with its instances as separate HF rows); both halves export as directories transformers loads
with no missing keys; DeBERTa-v3's GDES keeps the discriminator's gradient off the generator's
embeddings."""

import json
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import run_export, start_points
from bert_jax.model import rtd as rtd_model
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.pretrain import rtd
from bert_jax.training import run_setup
from configs import common, electra
from input_pipeline.tokenizer import WordPieceTokenizer
from test_loop import ENV, ROOT, logged_losses, run_until
from tests.tolerance import assert_trees_close

LENGTH, PREDICTIONS, MASK_ID = 24, 5, 4
# ELECTRA-small's quirks at a tiny size: tables (32) narrower than both networks, so each has
# its own embeddings_project; the generator half as wide (one head of 32).
DISC = BertConfig(arch='electra', vocab_size=1000, embedding_size=32, hidden_size=64,
                  num_layers=2, num_heads=4, intermediate_size=128,
                  max_position_embeddings=LENGTH)
INSTANCES = (24, 14, 9)  # tokens of three instances: alone, or packed as [24] and [14 + 9]


def rtd_cfg(sharing='tied') -> rtd_model.RtdConfig:
  return rtd_model.RtdConfig(DISC, rtd_model.generator_config(DISC, 0.5), sharing)


def noisy_params(cfg, seed=0):
  """Every weight random and non-trivial (LayerNorm scales near 1; biases and GDES residuals
  non-zero), drawn in numpy on the init's shapes: no init to compile."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(rtd_model.init_params, cfg, jax.random.key(0))

  def draw(path, x):
    noise = 0.05 * rng.normal(size=x.shape).astype(np.float32)
    return noise + np.float32('scale' in jax.tree_util.keystr(path))

  return jax.tree_util.tree_map_with_path(draw, shapes)


def instances(seed=0):
  """Per instance: ids, segment ids, masked positions, their original ids (ids hold [MASK])."""
  rng = np.random.default_rng(seed)
  out = []
  for n in INSTANCES:
    ids = rng.integers(5, DISC.vocab_size, n)
    seg = (np.arange(n) >= n // 2).astype(np.int64)
    pos = np.sort(rng.choice(np.arange(1, n - 1), PREDICTIONS - 1, replace=False))
    original = ids[pos].copy()
    ids[pos] = MASK_ID
    out.append((ids, seg, pos, original))
  return out


def batch_of(rows_of_instances):
  """Our batch with each row holding the listed instances (packed when a row has several)."""
  b, insts = len(rows_of_instances), instances()
  f = {k: np.zeros((b, LENGTH), np.int32) for k in ('input_ids', 'input_mask', 'segment_ids',
                                                     'position_ids', 'packed_segment_ids')}
  f.update({k: np.zeros((b, PREDICTIONS * 2), np.int32) for k in ('masked_lm_positions',
                                                                 'masked_lm_ids')})
  f['masked_lm_weights'] = np.zeros((b, PREDICTIONS * 2), np.float32)
  for r, members in enumerate(rows_of_instances):
    at, p = 0, 0
    for k, i in enumerate(members):
      ids, seg, pos, original = insts[i]
      n = len(ids)
      f['input_ids'][r, at:at + n], f['segment_ids'][r, at:at + n] = ids, seg
      f['input_mask'][r, at:at + n], f['position_ids'][r, at:at + n] = 1, np.arange(n)
      f['packed_segment_ids'][r, at:at + n] = k + 1
      f['masked_lm_positions'][r, p:p + len(pos)] = pos + at
      f['masked_lm_ids'][r, p:p + len(pos)] = original
      f['masked_lm_weights'][r, p:p + len(pos)] = 1
      at, p = at + n, p + len(pos)
  if all(len(m) == 1 for m in rows_of_instances):
    del f['position_ids'], f['packed_segment_ids']
  return f


PLAIN, PACKED = [[0], [1], [2]], [[0], [1, 2]]


def split_rows(x, rows_of_instances):
  """A [B, S] array of our rows -> one HF row per instance (right-padded to S)."""
  out = []
  for r, members in enumerate(rows_of_instances):
    at = 0
    for i in members:
      n = INSTANCES[i]
      out.append(np.pad(np.asarray(x)[r, at:at + n], (0, LENGTH - n)))
      at += n
  return np.stack(out)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """noisy params, both halves exported and loaded back by transformers."""
  cfg = rtd_cfg()
  params = noisy_params(cfg)
  out = run_export.export_rtd_pair(str(tmp_path_factory.mktemp('rtd') / 'pair'), cfg, params)
  models, infos = {}, {}
  for half, cls in (('discriminator', transformers.ElectraForPreTraining),
                    ('generator', transformers.ElectraForMaskedLM)):
    model, infos[half] = cls.from_pretrained(f'{out}/{half}', output_loading_info=True)
    models[half] = model.eval()
  return cfg, params, models, infos


def test_exports_load_in_transformers_with_no_missing_keys(exported):
  cfg, _, models, infos = exported
  for half, info in infos.items():
    assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), (
        half, info)
  assert type(models['discriminator']).__name__ == 'ElectraForPreTraining'
  gen = models['generator'].config
  assert (gen.hidden_size, gen.embedding_size, gen.num_attention_heads) == (32, 32, 1)
  # Tied: both directories hold the one shared word table.
  np.testing.assert_array_equal(
      models['generator'].electra.embeddings.word_embeddings.weight.detach().numpy(),
      models['discriminator'].electra.embeddings.word_embeddings.weight.detach().numpy())
  assert cfg.generator.embedding_width == cfg.discriminator.embedding_width == 32


@jax.jit
def _sums_and_rows(params, batch, key):
  """rtd_sums, and the (original, corrupted, labels) rows it scored: the same key draws the
  same samples from the same generator logits."""
  cfg = rtd_cfg()
  inputs = {k: batch[k] for k in rtd.GENERATOR_FEATURES if k in batch}
  logits = BertForPreTraining(cfg.generator).apply(
      {'params': rtd_model.half_params(params, rtd_model.GENERATOR)}, **inputs).mlm_logits
  sampled = rtd.sample_from_softmax(jax.random.split(key, 3)[1], logits)
  return rtd.rtd_sums(params, batch, key, cfg), rtd.corrupt(batch, sampled)


@pytest.mark.parametrize('layout', [PLAIN, PACKED], ids=['padded', 'packed'])
def test_losses_equal_electra_for_pretraining_and_masked_lm(exported, layout):
  _, params, models, _ = exported
  batch = batch_of(layout)
  sums, (original, fake, labels) = jax.device_get(_sums_and_rows(params, batch,
                                                                  jax.random.key(3)))
  assert 5 < labels.sum() < batch['masked_lm_weights'].sum() + 1  # only masked ones replaced
  assert (original[batch['input_mask'] > 0] != MASK_ID).all()

  hf = lambda x: torch.tensor(split_rows(x, layout)).long()
  with torch.no_grad():
    disc = models['discriminator'](input_ids=hf(fake), attention_mask=hf(batch['input_mask']),
                                   token_type_ids=hf(batch['segment_ids']), labels=hf(labels))
    mlm_labels = np.full(batch['input_ids'].shape, -100)
    for r in range(len(layout)):
      real = batch['masked_lm_weights'][r] > 0
      mlm_labels[r, batch['masked_lm_positions'][r][real]] = batch['masked_lm_ids'][r][real]
    gen = models['generator'](input_ids=hf(batch['input_ids']),
                              attention_mask=hf(batch['input_mask']),
                              token_type_ids=hf(batch['segment_ids']),
                              labels=torch.tensor(split_rows(mlm_labels + 100, layout) - 100))
  disc_loss = sums['disc_loss'] / sums['disc_weight']
  gen_loss = sums['mlm_loss'] / sums['mlm_weight']
  np.testing.assert_allclose(disc_loss, disc.loss.item(), rtol=2e-6)
  np.testing.assert_allclose(gen_loss, gen.loss.item(), rtol=2e-6)
  assert sums['disc_weight'] == sum(INSTANCES)
  print(f'{layout}: disc BCE {disc_loss:.7f} vs HF {disc.loss.item():.7f}, '
        f'gen MLM {gen_loss:.7f} vs HF {gen.loss.item():.7f}')


def test_gdes_keeps_the_discriminator_gradient_off_the_generator_embeddings():
  """The discriminator's loss reaches the shared (generator's) tables under tied sharing and
  never under gdes, where its residuals take it; the generator's layers get none in either
  (no gradient through the sample)."""
  batch = batch_of(PLAIN)

  def disc_grads(sharing):
    cfg = rtd_cfg(sharing)
    loss = lambda p: rtd.rtd_sums(p, batch, jax.random.key(3), cfg)['disc_loss']
    return jax.device_get(jax.jit(jax.grad(loss))(noisy_params(cfg)))

  norm = lambda t: float(sum(np.abs(x).sum() for x in jax.tree_util.tree_leaves(t)))
  tied, gdes = disc_grads('tied'), disc_grads('gdes')
  assert norm(tied['embeddings']) > 0
  assert norm(gdes['embeddings']) == 0.0
  assert norm(gdes['discriminator']['embeddings']['word_embeddings']) > 0
  for grads in (tied, gdes):
    assert norm(grads['generator']) == 0.0
    assert norm(grads['discriminator']['encoder']) > 0


def test_gdes_discriminator_reads_shared_plus_residual():
  cfg = rtd_cfg('gdes')
  params = noisy_params(cfg)
  disc = rtd_model.half_params(params, rtd_model.DISCRIMINATOR, 'gdes')
  np.testing.assert_array_equal(
      disc['embeddings']['word_embeddings']['embedding'],
      params['embeddings']['word_embeddings']['embedding'] +
      params['discriminator']['embeddings']['word_embeddings']['embedding'])
  # A pair of whole trees (a released pair, say) starts with zero residuals: the
  # discriminator reads its own tables exactly.
  again = rtd_model.rtd_params(disc, rtd_model.half_params(params, rtd_model.GENERATOR), 'gdes')
  assert not np.asarray(again['discriminator']['embeddings']['layer_norm']['scale']).any()
  assert_trees_close(rtd_model.half_params(again, rtd_model.DISCRIMINATOR, 'gdes'), disc, 0.0)


def test_electra_configs_give_the_papers_networks():
  """configs/electra.py through google-research/electra's get_generator_config: ELECTRA-small
  (12 x 256 on 128-wide tables) with its 1/4 generator, base (768) with its 1/3 one, the
  released generators' shapes."""
  shapes = {}
  for size in ('tiny', 'small', 'base'):
    config = electra.get_config(size)
    cfg = rtd.rtd_config(config, run_setup.model_config(config))
    shapes[size] = [(c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size,
                     c.embedding_width) for c in (cfg.discriminator, cfg.generator)]
  assert shapes == {'tiny': [(128, 2, 2, 512, 128), (64, 2, 1, 256, 128)],
                    'small': [(256, 12, 4, 1024, 128), (64, 12, 1, 256, 128)],
                    'base': [(768, 12, 12, 3072, 768), (256, 12, 4, 1024, 768)]}
  small = run_setup.model_config(electra.get_config('small'))
  with pytest.raises(ValueError, match='rtd.generator_hidden_fraction'):
    rtd_model.generator_config(small, 0.001)
  with pytest.raises(ValueError, match='model.arch=electra'):
    rtd_model.RtdConfig(BertConfig.from_preset('tiny'), BertConfig.from_preset('tiny'))


def test_binned_auc_equals_the_pairwise_count():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=400).astype(np.float32) * 3
  labels = rng.random(400) < 1 / (1 + np.exp(-logits))
  sums = rtd.discriminator_sums(jnp.asarray(logits), jnp.asarray(labels), jnp.ones(400, bool))
  auc = float(rtd.binned_auc(sums['disc_auc_pos'], sums['disc_auc_neg']))
  pos, neg = logits[labels], logits[~labels]
  want = ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (
      len(pos) * len(neg))
  assert abs(auc - want) < 2e-3, (auc, want)  # bins of 1/32 in logit: a few ties


def test_samples_follow_the_generator_softmax_across_blocks():
  """sample_from_softmax draws from softmax(logits) (a chi-square test on 200,000 draws over a
  300-id vocabulary: three blocks of 128, the last padded), never an id of zero probability,
  and a different row of logits gives its own distribution (rows are not mixed up)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 300)).astype(np.float32) * 1.5
  logits[0, ::7] = -np.inf  # zero probability, in every block
  logits[1, 250:] = -np.inf
  draws = 100_000
  rows = jnp.repeat(jnp.asarray(logits), draws, axis=0)
  ids = np.asarray(jax.jit(rtd.sample_from_softmax)(jax.random.key(0), rows)).reshape(2, draws)
  for row, drawn in zip(logits, ids):
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    counts = np.bincount(drawn, minlength=300)
    assert not counts[p == 0].any(), np.flatnonzero(counts * (p == 0))
    assert stats.chisquare(counts[p > 0], draws * p[p > 0]).pvalue > 1e-3
  assert (ids[1] < 250).all() and (ids[0] % 7 != 0).all()


def test_continues_from_a_released_layout_pair(exported, tmp_path):
  """train.init_from=<discriminator dir> and rtd.generator_init_from=<generator dir>, as
  google/electra-* publish them (here our export of `exported`): the RTD tree comes back
  whole, and a generator of another width is refused naming the fraction that fits."""
  cfg, params, _, _ = exported
  pair = str(tmp_path / 'pair')
  run_export.export_rtd_pair(pair, cfg, params)
  config = common.override(electra.get_config('tiny'), {
      'model.size': 'init_from', 'model.scan_layers': True, 'data.max_seq_length': LENGTH,
      'train.init_from': f'{pair}/discriminator', 'rtd.generator_init_from': f'{pair}/generator',
      'rtd.generator_hidden_fraction': 0.5})
  config = start_points.with_start_shape(config)
  run_cfg = rtd.rtd_config(config, run_setup.model_config(config))
  assert run_cfg.discriminator == DISC.replace(attention_impl=run_cfg.discriminator.attention_impl)
  step, got = rtd.start_params(config, run_cfg, params)
  assert step == 0
  assert_trees_close(got, params, 0.0)
  config.rtd.generator_hidden_fraction = 0.25
  with pytest.raises(ValueError, match=r'generator_init_from=.* is 32 wide with 2 layers; the '
                                       r'run\'s generator is 16 x 2\. Set --config\.rtd\.'
                                       r'generator_hidden_fraction=0\.5'):
    rtd.start_params(config, rtd.rtd_config(config, run_setup.model_config(config)), params)


def test_cli_run_resumes_bit_identically_after_kill_9_and_exports_the_pair(data, tmp_path):
  """`python -m bert_jax.main --config=configs/electra.py:tiny` on BERT's NSP records (their
  sentence labels unread), killed with -9 once it logged step 5 and rerun: the rerun resumes
  from the checkpoint at 3 and logs steps 4-5 exactly as the killed process computed them
  uninterrupted (so params, Adam moments, rng and the data position all carried over); its
  workdir exports the pair transformers loads."""
  values = {'model.vocab_size': 2000, 'model.num_layers': 1, 'data.train_files':
            str(data / 'train-*'), 'data.vocab_file': str(data / 'vocab.txt'),
            'data.sentence_objective': 'nsp', 'data.max_seq_length': 64,
            'data.max_predictions_per_seq': 10, 'data.shuffle_buffer': 100,
            'train.num_steps': 7, 'train.global_batch_size': 8, 'train.log_every': 1,
            'train.checkpoint_every': 3, 'optimizer.warmup_steps': 2}
  cut = str(tmp_path / 'cut')
  metrics = os.path.join(cut, 'metrics.jsonl')
  cmd = [sys.executable, '-m', 'bert_jax.main', '--config=configs/electra.py:tiny',
         f'--workdir={cut}'] + [f'--config.{k}={v}' for k, v in values.items()]
  assert run_until(cmd, metrics, 5, signal.SIGKILL) == -signal.SIGKILL
  uninterrupted = logged_losses(metrics)
  assert 5 <= max(uninterrupted) < 7, 'killed too late to resume anything'
  done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  logged = [json.loads(line) for line in open(metrics)]
  assert [r['step'] for r in logged if 'train/loss' in r].count(4) == 2  # relogged from 3
  resumed = logged_losses(metrics)
  assert sorted(resumed) == list(range(1, 8))
  assert {s: resumed[s] for s in uninterrupted} == uninterrupted  # bit for bit
  last = [r for r in logged if r.get('step') == 7 and 'train/disc_auc' in r][-1]
  assert 0 <= last['train/disc_auc'] <= 1 and last['train/disc_replaced_fraction'] > 0

  out = run_export.export_workdir(cut, str(tmp_path / 'hf'))
  for half, cls in (('discriminator', transformers.ElectraForPreTraining),
                    ('generator', transformers.ElectraForMaskedLM)):
    _, info = cls.from_pretrained(f'{out}/{half}', output_loading_info=True)
    assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys'))
  tok = transformers.AutoTokenizer.from_pretrained(f'{out}/discriminator')
  assert tok.convert_tokens_to_ids('the') == WordPieceTokenizer(
      str(data / 'vocab.txt')).encode('the')[0]
