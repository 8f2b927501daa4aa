"""Fast checks of the demo's pieces: the random-init start point its MR comparison uses, the
loss-curve smoothing, the eval baselines it prints, the opinion-snippet corpus reader, its
recipes (configs/demo.py), the fill-mask load and the line on its pre-training budget."""

import json
import os

import jax
import numpy as np
import pytest
import transformers

from bert_jax import demo
from bert_jax.convert import fill_mask, start_points
from bert_jax.pretrain import baselines
from configs import demo as demo_recipes, finetune as finetune_configs
from input_pipeline.pretrain import corpus, create_pretraining_data as cpd
from input_pipeline.pretrain.instances import MaskingConfig
from input_pipeline.finetune import mr
from input_pipeline.tokenizer import WordPieceTokenizer
import hf_reference
from test_tasks import _tar_gz
from bert_jax.model.encoder import BertConfig

TINY = BertConfig.from_preset('tiny', vocab_size=100)


def write_vocab(path):
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'a', 'film', 'good', '##s']
  path.write_text('\n'.join(words + [f'w{i}' for i in range(100 - len(words))]) + '\n')
  return str(path)


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('hf')
  path = str(tmp / 'hf')
  hf_reference.torch_model(TINY).save_pretrained(path)
  WordPieceTokenizer(write_vocab(tmp / 'vocab.txt')).save_pretrained(path)
  return path


def _leaves(params):
  return jax.tree_util.tree_leaves_with_path(params)


def test_random_start_point_keeps_config_and_tokenizer_with_fresh_weights(hf_dir):
  loaded = start_points.load_start_point(hf_dir)
  rand = start_points.load_start_point(f'random:{hf_dir}')
  assert rand.kind == 'random' and rand.path == f'random:{hf_dir}'
  assert rand.cfg == loaded.cfg and rand.do_lower_case == loaded.do_lower_case
  assert rand.tokenizer.vocab_size == loaded.tokenizer.vocab_size
  assert rand.head is None and rand.head_params is None
  assert jax.tree_util.tree_structure(rand.params) == jax.tree_util.tree_structure(loaded.params)
  for (path, a), (_, b) in zip(_leaves(rand.params), _leaves(loaded.params)):
    assert a.shape == b.shape and a.dtype == np.float32, path
    if path[-1].key in ('kernel', 'embedding'):  # redrawn as pre-training draws them
      assert not np.allclose(a, b), path
      assert 0.015 < a.std() < 0.025, path  # N(0, 0.02) (truncated)
    elif path[-1].key == 'bias':
      np.testing.assert_array_equal(a, 0.0)
  # LayerNorm starts at 1 and 0, not at the loaded model's values.
  ln = rand.params['embeddings']['layer_norm']
  np.testing.assert_array_equal(ln['scale'], 1.0)
  np.testing.assert_array_equal(ln['bias'], 0.0)
  assert not np.allclose(loaded.params['embeddings']['layer_norm']['scale'], 1.0)


def test_randomized_is_a_function_of_the_key(hf_dir):
  start = start_points.load_start_point(f'random:{hf_dir}')
  a = start_points.randomized(start, jax.random.key(1))
  b = start_points.randomized(start, jax.random.key(1))
  c = start_points.randomized(start, jax.random.key(2))
  jax.tree_util.tree_map(np.testing.assert_array_equal, a.params, b.params)
  assert not all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a.params),
                                                      jax.tree_util.tree_leaves(c.params)))
  with pytest.raises(ValueError, match='random: given twice'):
    start_points.load_start_point(f'random:random:{hf_dir}')


def test_random_start_point_gets_a_task_head(hf_dir):
  from bert_jax.model import heads  # pylint: disable=g-import-not-at-top
  start = start_points.load_start_point(f'random:{hf_dir}')
  head, params = start_points.init_head_params(start, heads.Head('sequence_classification', 2),
                                               rng=jax.random.key(0))
  assert head.num_labels == 2 and params


def test_smooth_is_a_debiased_ema():
  assert demo.smooth([]) == []
  assert demo.smooth([5.0, 1.0, 3.0], 0.0) == [5.0, 1.0, 3.0]
  np.testing.assert_allclose(demo.smooth([4.0] * 50, 0.9), 4.0)  # no pull toward 0
  s = demo.smooth([10.0] * 5 + [0.0] * 20, 0.9)
  assert s[0] == 10.0 and s[4] == pytest.approx(10.0)
  assert all(a > b for a, b in zip(s[5:], s[6:])) and 0 < s[-1] < 2
  # point 1 is (0.9 * 0.1 * 10 + 0.1 * 0) / (0.9 * 0.1 + 0.1)
  assert demo.smooth([10.0, 0.0], 0.9)[1] == pytest.approx(0.9 * 10 / 1.9)


SENTENCES = ['the cat sat on the mat .', 'a dog ran in the park .', 'the film is good .',
             'this movie was bad .', 'we like the story .', 'it rains in the city .']


def _records(tmp_path, pack):
  vocab = sorted({w for s in SENTENCES for w in s.split()})
  vocab_file = tmp_path / 'vocab.txt'
  vocab_file.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + vocab) + '\n')
  rng = np.random.default_rng(0)
  docs = [[SENTENCES[j] for j in rng.integers(0, len(SENTENCES), size=n)]
          for n in rng.integers(1, 9, size=60)]
  text = tmp_path / 'docs.txt'
  corpus.write_text_file(docs, str(text))
  out = str(tmp_path / f'eval_{pack}.tfrecord')
  stats = cpd.run(cpd.Job(output_file=out, vocab_file=str(vocab_file), input_file=str(text),
                          masking=MaskingConfig(max_seq_length=32, max_predictions_per_seq=5),
                          dupe_factor=1, pack=pack, max_instances_per_row=demo_recipes.PACK_K))
  return out, stats


def eval_config(files, pack):
  """The demo's pre-training config reading `_records`' 32-token eval records."""
  config = demo_recipes.pretraining(eval_files=files, pack=pack)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 32, 5
  return config


@pytest.mark.parametrize('pack', [False, True])
def test_eval_baselines_count_real_instances_only(tmp_path, pack):
  files, stats = _records(tmp_path, pack)
  base = baselines.eval_baselines(eval_config(files, pack))
  random_next = stats['nsp_random_next_fraction']
  assert random_next > 0.55  # short documents: most pairs take a random next
  assert base['sentence'] == pytest.approx(max(random_next, 1 - random_next), abs=1e-4)
  assert 0 < base['mlm'] < 0.5
  if pack:
    assert stats['rows'] < stats['instances']
    unpacked, _ = _records(tmp_path, False)
    again = baselines.eval_baselines(eval_config(unpacked, False))
    assert again['sentence'] == pytest.approx(base['sentence'], abs=0.1)


def test_opinion_documents_group_by_id_and_never_read_movie_reviews(tmp_path):
  files = {
      'hutto_ICWSM_2014/nytEditorialSnippets_GroundTruth.txt':
          b'1_1\t0.4\tFirst editorial opens. It goes on.\r\n1_2\t0.1\tIt ends.\r\n'
          b'2_1\t-1.0\tA second editorial.\r\n',
      'hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt':
          b'7_1\t2.0\tgreat player.\n7_2\t1.5\tworks fine.\n',
      'hutto_ICWSM_2014/tweets_GroundTruth.txt': b'1\t2.7\tSo lucky. Yay.\n2\t1.4\tNice.\n',
      mr.RATINGS_FILE: b'1\t2.2\tA MOVIE REVIEW THE DEMO MUST NOT PRE-TRAIN ON.\n'}
  sdist = tmp_path / mr.SDIST
  sdist.write_bytes(_tar_gz({mr.INNER_ARCHIVE: _tar_gz(files)}))
  stats = corpus.CorpusStats()
  docs = list(corpus.opinion_documents(str(sdist), stats))
  assert docs == [['First editorial opens.', 'It goes on.', 'It ends.'],
                  ['A second editorial.'], ['great player.', 'works fine.'],
                  ['So lucky.', 'Yay.'], ['Nice.']]
  assert stats.documents == 5 and stats.files == 3 and stats.lines == 7
  assert 'MOVIE' not in json.dumps(docs)


def test_mr_config_is_the_benchmark_recipe():
  c = demo.mr_config('random:somewhere', 3, **{'optimizer.learning_rate': 3e-4})
  default = finetune_configs.get_config('mr')
  assert (c.task, c.init, c.seeds, c.export) == ('mr', 'random:somewhere', 3, False)
  assert c.data.max_seq_length == 64 and c.data.max_train_examples == 0
  assert c.train.to_dict() == {**default.train.to_dict(), 'num_epochs': 3}  # batch 32
  assert c.optimizer.learning_rate == 3e-4 and c.optimizer.warmup_proportion == 0.1


def test_minilm_arm_is_the_same_command_on_a_smaller_budget():
  """The third arm differs from the other two in learning rate, epochs and data cut only."""
  mr_arm, minilm = demo_recipes.mr('x'), demo.mr_config('x', 1, 'mr_minilm')
  full = demo_recipes.get_config('mr_minilm_full')
  assert (minilm.optimizer.learning_rate, minilm.train.num_epochs,
          minilm.data.max_train_examples) == (5e-5, 1, 4000)
  assert (full.train.num_epochs, full.data.max_train_examples) == (2, 0)
  for c in (minilm, full):
    for block in ('model', 'data', 'optimizer', 'train'):
      a, b = c[block].to_dict(), mr_arm[block].to_dict()
      assert {k for k in a if a[k] != b[k]} <= {'learning_rate', 'num_epochs',
                                                  'max_train_examples'}, block
  assert demo.recipe_line(minilm) == (
      '64 tokens, lr 5e-5, 1 epoch of the first 4,000 training sentences')
  with pytest.raises(ValueError, match='configs/demo.py:nope: unknown recipe'):
    demo_recipes.get_config('nope')


def test_minilm_path_is_a_start_point_directory():
  path = demo.minilm_path()
  assert isinstance(path, str)  # config.init takes a str, not the package's pathlib.Path
  assert os.path.exists(os.path.join(path, 'modules.json'))  # a sentence-transformers dir
  assert start_points.detect_kind(path) == start_points.HF_DIR


def test_not_there_yet_counts_the_runs_token_positions():
  config = demo_recipes.pretraining()
  line = demo.not_there_yet(config, 2500)
  assert '\n' not in line
  assert '2,500 steps x 32 rows x 128 tokens = 1.0e+07 token positions' in line
  # configs/bert_base.py: 900k steps x 256 x 128 + 100k x 256 x 512
  assert "BERT's recipe (configs/bert_base.py) 4.3e+10 (4,160x more)" in line
  assert '2.0e+07 (4,800 steps) still fine-tuned below random init' in line


def test_fill_mask_loads_the_export_quietly_and_checks_what_it_left_out(hf_dir, tmp_path,
                                                                         capfd):
  """A BertForPreTraining export loads as BertForMaskedLM without transformers' load report;
  only the pooler and NSP head are left out, and a directory missing the MLM head is refused."""
  _, left_out = fill_mask.masked_lm_model(hf_dir)
  assert left_out == ['bert.pooler.dense.bias', 'bert.pooler.dense.weight',
                      'cls.seq_relationship.bias', 'cls.seq_relationship.weight']
  text, top = fill_mask.fill_mask_example(hf_dir)
  assert '[MASK]' in text and len(top) == 5
  out, err = capfd.readouterr()
  assert 'LOAD REPORT' not in out + err and 'UNEXPECTED' not in out + err
  bare = str(tmp_path / 'encoder_only')
  transformers.BertModel(hf_reference.torch_model(TINY).config).save_pretrained(bare)
  with pytest.raises(ValueError, match=r'encoder_only: not a BertForPreTraining export.*'
                                       r'missing.*cls\.predictions'):
    fill_mask.masked_lm_model(bare)


def test_pretraining_pays_verdict():
  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  arm = lambda lo, mid, hi: {'min': lo, 'median': mid, 'max': hi}
  compare = lambda a, b: harness.compare_arms(a, b, 'pre-training')
  pays = compare(arm(0.80, 0.81, 0.82), arm(0.70, 0.75, 0.79))
  assert pays['beyond_spread'] and pays['gap'] == pytest.approx(0.06)
  assert pays['verdict'] == 'pre-training pays, beyond the seed spread'
  costs = compare(arm(0.740, 0.740, 0.747), arm(0.774, 0.776, 0.782))
  assert costs['beyond_spread'] and costs['verdict'].startswith('pre-training costs')
  assert compare(arm(0.7, 0.75, 0.8), arm(0.72, 0.74, 0.76))['verdict'] == (
      'within the seed spread')
