"""The fine-tuning entry point end to end on tiny tasks a tiny random-init BERT can learn:
classification (multi-seed, export parity with transformers), regression, CoNLL tagging,
SQuAD, SWAG multiple choice, exact resume, progress lines and bad-input errors."""

import collections
import contextlib
import csv
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.convert import hf, hf_heads, start_points
from bert_jax.finetune import metrics, program, results as finetune_results, run as finetune
from bert_jax.finetune import squad_answers
from bert_jax.finetune import tasks as finetune_tasks
from bert_jax.model import heads
from bert_jax.model.encoder import BertConfig
from bert_jax.training import checkpointing, run_control
from bert_jax.training.progress import LineProgress, progress_bar
from configs import common, finetune as finetune_configs
from input_pipeline.finetune import batching, registry, squad
from input_pipeline.tokenizer import SentencePieceTokenizer, WordPieceTokenizer
from cpu_env import cpu_env, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
FILLER = ['the', 'a', 'film', 'plot', 'actor', 'scene', 'is', 'was', 'and', 'it', 'of', 'story',
          'music', 'very', 'quite', 'long', 'short', 'new', 'old', 'this', 'that', 'with']
MARKERS = ['good', 'great', 'bad', 'awful', 'alice', 'bob', 'paris', 'rome', 'who', 'went',
           'to', '?', '.']


def tiny_start(directory, tokenizer, seed=0, num_layers=2):
  """A random-init (HF's init) BERT-tiny (`num_layers` of it) saved by transformers, with our
  tokenizer's files."""
  torch.manual_seed(seed)
  cfg = BertConfig.from_preset('tiny', vocab_size=tokenizer.vocab_size, num_layers=num_layers)
  hf_cfg = transformers.BertConfig(**{k: v for k, v in hf.config_to_hf(cfg).items()
                                      if k not in ('architectures', 'model_type')})
  transformers.BertForPreTraining(hf_cfg).save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  return str(directory)


@pytest.fixture(scope='module')
def start_dir(tmp_path_factory):
  """The start point of every run here: one layer of BERT-tiny (XLA compiles each run's
  programs in ~20-35% less CPU than two; the tasks are learnable by one, and the export maps
  every layer by the same code)."""
  d = tmp_path_factory.mktemp('start')
  vocab = d / 'vocab.txt'
  vocab.write_text('\n'.join(SPECIALS + FILLER + MARKERS) + '\n')
  return tiny_start(d / 'hf', WordPieceTokenizer(str(vocab), do_lower_case=True), num_layers=1)


def sentences(rng, n, positive=('good', 'great'), negative=('bad', 'awful')):
  """Filler sentences with two sentiment words each, alternately from `positive` and
  `negative`: (text, is positive). Learnable from any position, so a few steps suffice."""
  out = []
  for i in range(n):
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
    words += [rng.choice(positive if i % 2 else negative) for _ in range(2)]
    rng.shuffle(words)
    out.append((' '.join(words), bool(i % 2)))
  rng.shuffle(out)
  return out


def write_table(path, rows, header=('sentence', 'label')):
  path.write_text('\t'.join(header) + '\n' + ''.join('\t'.join(map(str, r)) + '\n' for r in rows))
  return str(path)


def config(task, start, **overrides):
  c = finetune_configs.get_config(task)
  c.init = start
  c.data.max_seq_length = 32
  c.train.global_batch_size = 16
  c.train.eval_batch_size = 32
  c.train.log_every = 1
  c.optimizer.learning_rate = 5e-4  # a random-init encoder, not a pre-trained one
  return common.override(c, overrides)


def classification_files(tmp_path):
  rng = random.Random(0)
  label = lambda has: 'pos' if has else 'neg'
  files = {}
  for split, n in (('train', 192), ('dev', 48), ('test', 48)):
    rows = [(text, label(has)) for text, has in sentences(rng, n)]
    files[split] = write_table(tmp_path / f'{split}.tsv', rows)
  return files


def generic_config(files, start, **overrides):
  return config('generic', start, **{'data.train_file': files['train'],
                                     'data.dev_file': files['dev'],
                                     'data.test_file': files['test'], **overrides})


def export_matches_ours(path, auto_class, enc):
  """Load an export in transformers and with our start-point loader; both give the same
  logits (<= 1e-4) on `enc`. Returns transformers' model and outputs."""
  model, info = auto_class.from_pretrained(path, output_loading_info=True)
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  model.eval()
  with torch.no_grad():
    theirs = model(**{k: torch.from_numpy(v) for k, v in enc.items()})
  start = start_points.load_start_point(path)
  head, params = start_points.init_head_params(start)
  ours = heads.build_model(start.cfg, head).apply(
      {'params': params}, enc['input_ids'], enc['attention_mask'], enc['token_type_ids'])
  pairs = ([(ours.start_logits, theirs.start_logits), (ours.end_logits, theirs.end_logits)]
           if head.task == heads.SPAN else [(ours, theirs.logits)])
  for a, b in pairs:
    assert np.max(np.abs(np.asarray(a) - b.numpy())) <= 1e-4
  return model, theirs


def encode(path, texts, pairs=None, length=32):
  tok = transformers.AutoTokenizer.from_pretrained(path)
  enc = tok(texts, pairs, padding='max_length', max_length=length, truncation=True,
            return_tensors='np')
  return {k: v.astype(np.int64) for k, v in enc.items()}


def read_json(path):
  with open(path) as f:
    return json.load(f)


# ----------------------------------------------------------------------------- classification


@pytest.fixture(scope='module')
def classified(start_dir, tmp_path_factory):
  """Generic TSV classification, 2 seeds x 3 epochs: (files, workdir, returned results)."""
  d = tmp_path_factory.mktemp('classified')
  files = classification_files(d)
  workdir = str(d / 'run')
  return files, workdir, finetune.run(generic_config(files, start_dir, seeds=2), workdir)


def test_classification_learns_reports_seeds_and_exports_what_transformers_loads(classified):
  files, workdir, returned = classified
  saved = read_json(os.path.join(workdir, 'results.json'))
  assert saved['seeds'] == [0, 1] and saved['complete'] and saved['selected_on'] == 'dev'
  assert saved['baseline_kind'] == 'majority-class'
  for split in ('dev', 'test'):
    s = saved['splits'][split]
    assert s['headline_metric'] == 'accuracy'
    assert abs(s['baseline']['accuracy'] - 0.5) <= 0.05  # half the sentences are positive
    acc = s['summary']['accuracy']
    assert len(acc['values']) == 2 and acc['min'] <= acc['median'] <= acc['max']
    assert acc['median'] >= 0.9, (split, acc)  # learnt: far above the baseline
  for run in saved['runs']:
    losses = [h['train_loss'] for h in run['history']]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3, losses
    assert run['export'] == os.path.join(workdir, 'hf_export', f'seed_{run["seed"]}')
    assert run['history'][run['best_epoch'] - 1].get('best')
  assert returned['runs'][1]['scores'] == saved['runs'][1]['scores']
  table = open(os.path.join(workdir, 'results.md')).read()
  assert '| median (min-max) of 2 |' in table and '| majority-class baseline | | 0.5' in table

  # The export is the best epoch's model: transformers reproduces its dev accuracy exactly,
  # and our model on the exported weights gives the same logits.
  run = saved['runs'][0]
  rows = [line.split('\t') for line in open(files['dev']).read().splitlines()[1:]]
  model, out = export_matches_ours(run['export'], transformers.AutoModelForSequenceClassification,
                                   encode(run['export'], [r[0] for r in rows]))
  assert model.config.id2label == {0: 'neg', 1: 'pos'}
  labels = np.array([model.config.label2id[r[1]] for r in rows])
  assert np.mean(out.logits.numpy().argmax(-1) == labels) == run['scores']['dev']['accuracy']


def sigterm_after_call(method, n: int | None):
  """`method` that sends this process a real SIGTERM (to the run's real handler) right after
  its `n`-th call returns (None: never); `.calls` counts the calls."""

  def wrapped(self, *args):
    out = method(self, *args)
    wrapped.calls += 1
    if wrapped.calls == n:
      os.kill(os.getpid(), signal.SIGTERM)
    return out

  wrapped.calls = 0
  return wrapped


def test_resumed_run_equals_the_uninterrupted_one(classified, start_dir, tmp_path, monkeypatch):
  """SIGTERM during step 5 (saved there), then stopped after epoch 1 (as a time-limited job
  would be), the same command continues to the same params, losses and scores as seed 0 of
  the uninterrupted 3-epoch run."""
  files, whole_dir, whole = classified
  workdir = str(tmp_path / 'resumed')
  monkeypatch.setattr(program.Program, 'train_step',
                      sigterm_after_call(program.Program.train_step, 5))
  preempted = finetune.run(generic_config(files, start_dir), workdir)
  monkeypatch.undo()
  assert preempted['runs'][0]['step'] == 5 and not preempted['complete']
  assert preempted['runs'][0]['best_epoch'] is None
  assert checkpointing.restore_params(os.path.join(workdir, 'seed_0'))[0] == 5
  first = finetune.run(generic_config(files, start_dir, **{'train.stop_after_epoch': 1}),
                       workdir)
  assert not first['complete'] and first['runs'][0]['epochs_done'] == 1
  assert checkpointing.restore_params(os.path.join(workdir, 'seed_0'))[0] == 12
  with pytest.raises(ValueError, match=r'seed_0/checkpoints/12 holds another state layout .*'
                                       r'params.encoder.layer_0.*saved .* vs expected absent'
                                       r'.* Resume with the model.scan_layers'):  # unrolled
    finetune.run(generic_config(files, start_dir, **{'model.scan_layers': True}), workdir)
  second = finetune.run(generic_config(files, start_dir), workdir)
  assert second['complete']
  strip = lambda history: [{k: v for k, v in h.items() if k != 'train_examples_per_second'}
                           for h in history]
  assert strip(second['runs'][0]['history']) == strip(whole['runs'][0]['history'])
  assert second['runs'][0]['scores'] == whole['runs'][0]['scores']
  step, ours = checkpointing.restore_params(os.path.join(workdir, 'seed_0'))
  whole_step, theirs = checkpointing.restore_params(os.path.join(whole_dir, 'seed_0'))
  assert step == whole_step == 36
  for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
    np.testing.assert_array_equal(a, b)
  again = finetune.run(generic_config(files, start_dir), workdir)  # finished: nothing to do
  assert again['runs'][0]['history'] == second['runs'][0]['history']
  with pytest.raises(ValueError, match=r"'total_steps': 36}.*'total_steps': 48}.*"
                                       'train.stop_after_epoch ends a run early'):
    finetune.run(generic_config(files, start_dir, **{'train.num_epochs': 4}), workdir)


def run_stopped_by_sigterm(monkeypatch, config, workdir, steps: int):
  """finetune.run with the real SIGTERM sent to this process after `steps` training steps;
  returns its results and Program.predict's call counter (`.calls`, from now on)."""
  predict = sigterm_after_call(program.Program.predict, None)
  monkeypatch.setattr(program.Program, 'predict', predict)
  with monkeypatch.context() as m:
    m.setattr(program.Program, 'train_step',
              sigterm_after_call(program.Program.train_step, steps))
    return finetune.run(config, workdir), predict


def without_speed(history):
  return [{k: v for k, v in h.items() if k != 'train_examples_per_second'} for h in history]


def test_a_notice_in_an_epochs_last_step_saves_before_scoring_and_the_resume_scores_it(
    classified, start_dir, tmp_path, monkeypatch):
  """A SIGTERM during step 12, the last of epoch 1: the state is saved at once, with no dev
  eval, test prediction or export eating the grace period; the resumed run scores epoch 1
  from that state and ends exactly as seed 0 of the uninterrupted run."""
  files, _, whole = classified
  workdir = str(tmp_path / 'run')
  stopped, predicted = run_stopped_by_sigterm(monkeypatch, generic_config(files, start_dir),
                                              workdir, 12)
  assert stopped['runs'][0]['step'] == 12 and stopped['runs'][0]['epochs_done'] == 0
  assert not predicted.calls and not os.path.exists(os.path.join(workdir, 'hf_export'))
  assert checkpointing.restore_params(os.path.join(workdir, 'seed_0'))[0] == 12
  resumed = finetune.run(generic_config(files, start_dir), workdir)
  assert resumed['complete']
  assert without_speed(resumed['runs'][0]['history']) == without_speed(
      whole['runs'][0]['history'])


def test_a_notice_during_the_test_prediction_saves_before_the_export_and_the_resume_exports(
    classified, start_dir, tmp_path, monkeypatch):
  """A SIGTERM during epoch 1's test prediction (its best so far, so an export follows): the
  state is saved before the export, with nothing recorded or exported (a multi-host export
  could outlast the grace period); the resumed run redoes the epoch end from that state: the
  uninterrupted run's epoch 1 scores, and the export."""
  files, _, whole = classified
  workdir = str(tmp_path / 'run')
  predict = sigterm_after_call(program.Program.predict, 2)  # epoch 1's dev, then its test
  with monkeypatch.context() as m:
    m.setattr(program.Program, 'predict', predict)
    stopped = finetune.run(generic_config(files, start_dir), workdir)
  assert stopped['runs'][0]['step'] == 12 and stopped['runs'][0]['epochs_done'] == 0
  assert predict.calls == 2 and not os.path.exists(os.path.join(workdir, 'hf_export'))
  assert checkpointing.restore_params(os.path.join(workdir, 'seed_0'))[0] == 12
  resumed = finetune.run(generic_config(files, start_dir, **{'train.stop_after_epoch': 1}),
                         workdir)  # the epoch end only: no further training
  assert resumed['runs'][0]['step'] == 12
  assert without_speed(resumed['runs'][0]['history']) == without_speed(
      whole['runs'][0]['history'][:1])
  assert resumed['runs'][0]['export'] == os.path.join(workdir, 'hf_export')
  assert os.path.exists(os.path.join(workdir, 'hf_export', 'config.json'))


def test_a_non_finite_loss_stops_before_any_checkpoint(start_dir, tmp_path):
  """Metrics are read one step late (the device never waits for the host), yet a loss that
  overflows mid-epoch stops the run with the step named and nothing saved."""
  files = classification_files(tmp_path)
  workdir = str(tmp_path / 'w')
  # The parameters overflow a step before the loss does: the rule stops on param_norm then.
  message = (r'seed 0 step \d+: loss=\S+ grad_norm=\S+ param_norm=\S+ is not finite; .*'
             r'\(no checkpoint yet\)')
  with pytest.raises(run_control.NonFiniteError, match=message):
    finetune.run(generic_config(files, start_dir, **{'optimizer.learning_rate': 1e38}), workdir)
  assert not os.path.exists(checkpointing.checkpoint_dir(os.path.join(workdir, 'seed_0'))) or \
      not os.listdir(checkpointing.checkpoint_dir(os.path.join(workdir, 'seed_0')))


def test_a_notice_in_the_runs_last_step_leaves_it_incomplete_and_one_rescoring_finishes_it(
    classified, start_dir, tmp_path, monkeypatch):
  """SIGTERM during step 36, the run's last: saved unscored, so the run is not complete; the
  next run scores epoch 3 once (no training follows, so the scores are kept beside the
  checkpoint) and a third run has nothing left to do."""
  files, _, whole = classified
  workdir = str(tmp_path / 'run')
  stopped, predicted = run_stopped_by_sigterm(monkeypatch, generic_config(files, start_dir),
                                              workdir, 36)
  assert stopped['runs'][0]['step'] == 36 and stopped['runs'][0]['epochs_done'] == 2
  assert not stopped['complete'] and '**Incomplete run.**' in finetune_results.markdown(stopped)
  before = predicted.calls
  finished = finetune.run(generic_config(files, start_dir), workdir)
  assert finished['complete'] and predicted.calls > before
  assert without_speed(finished['runs'][0]['history']) == without_speed(
      whole['runs'][0]['history'])
  before = predicted.calls
  again = finetune.run(generic_config(files, start_dir), workdir)
  assert predicted.calls == before and again['complete']  # scored once, not at every run
  assert again['runs'][0]['scores'] == whole['runs'][0]['scores']


def test_the_non_finite_rule_stops_on_a_nan_gradient_norm_with_a_finite_loss(
    start_dir, tmp_path, monkeypatch):
  """Pre-training's rule (run_control.check_finite): a step whose gradient norm is NaN stops
  fine-tuning too, although its loss is still finite, before any checkpoint."""
  files = classification_files(tmp_path)
  workdir = str(tmp_path / 'w')
  real_step = program.Program.train_step

  def nan_gradient_at_step_3(self, state, batch):
    state, metrics = real_step(self, state, batch)
    if int(state.step) == 3:  # what a NaN gradient reports before it reaches the loss
      metrics = dict(metrics, grad_norm=jax.numpy.float32('nan'))
    return state, metrics

  monkeypatch.setattr(program.Program, 'train_step', nan_gradient_at_step_3)
  with pytest.raises(run_control.NonFiniteError,
                     match=r'seed 0 step 3: loss=[0-9.]+ grad_norm=nan param_norm=[0-9.]+ is '
                           r'not finite; stopped without saving \(no checkpoint yet\)'):
    finetune.run(generic_config(files, start_dir), workdir)
  ckpt = checkpointing.checkpoint_dir(os.path.join(workdir, 'seed_0'))
  assert not os.path.exists(ckpt) or not os.listdir(ckpt)


# ----------------------------------------------------------------------------- other tasks


def test_mr_format_regression(start_dir, tmp_path):
  """MR's ratings file, `mr_regression`: MSE on the rating, Pearson far above the mean
  baseline (whose correlation is undefined: null in results.json)."""
  rng = random.Random(1)
  lines = [f'{i}\t{(2.0 if positive else -2.0) + rng.uniform(-1, 1):.3f}\t{text}'
           for i, (text, positive) in enumerate(sentences(rng, 240))]
  path = tmp_path / 'movieReviewSnippets_GroundTruth.txt'
  path.write_text('\r\n'.join(lines))
  workdir = str(tmp_path / 'run')
  results = finetune.run(config('mr_regression', start_dir, **{'data.mr_file': str(path)}),
                         workdir)
  dev = results['splits']['dev']
  assert dev['headline_metric'] == 'pearson' and results['baseline_kind'] == 'mean-prediction'
  assert results['runs'][0]['scores']['dev']['pearson'] >= 0.8
  assert 'test' in results['runs'][0]['scores']
  assert read_json(os.path.join(workdir, 'results.json'))['splits']['dev']['baseline'][
      'pearson'] is None
  assert results['runs'][0]['scores']['dev']['mse'] < dev['baseline']['mse'] / 4
  texts = [line.split('\t')[2] for line in lines[:8]]
  model, _ = export_matches_ours(os.path.join(workdir, 'hf_export'),
                                 transformers.AutoModelForSequenceClassification,
                                 encode(os.path.join(workdir, 'hf_export'), texts))
  assert model.config.problem_type == 'regression' and model.config.num_labels == 1


def conll_text(rng, n):
  """Sentences where alice/bob are people and paris/rome places, CoNLL-2003 columns."""
  tags = {'alice': 'PER', 'bob': 'PER', 'paris': 'LOC', 'rome': 'LOC'}
  lines = ['-DOCSTART- -X- -X- O', '']
  for _ in range(n):
    words = [rng.choice(FILLER) for _ in range(rng.randint(3, 6))] + rng.sample(list(tags), 2)
    rng.shuffle(words)
    lines += [f'{w} NN I-NP {"B-" + tags[w] if w in tags else "O"}' for w in words] + ['']
  return '\n'.join(lines)


BUCKET_COMPARISON = {'train.stop_after_epoch': 1, 'export': False, 'data.length_buckets': 1}


def bucketed_and_full(task, start, values, workdir):
  """`task` run with its length buckets (the default, 4) and, for its first epoch (the same
  schedule, so the same steps), with full-length rows only (`data.length_buckets=1`): the
  results of both, and what the bucketed run wrote to stderr. Dropout 0: the two runs' row
  lengths would draw other masks."""
  values = dict(values, **{'model.hidden_dropout': 0.0, 'model.attention_dropout': 0.0})
  err = io.StringIO()
  with contextlib.redirect_stderr(err):  # the progress lines look sys.stderr up late
    cut = finetune.run(config(task, start, **values), str(workdir / 'cut'))
  full = finetune.run(config(task, start, **values, **BUCKET_COMPARISON), str(workdir / 'full'))
  return cut, err.getvalue(), full


def conll_files(d):
  """CoNLL train (160 sentences: 10 steps of 16 an epoch), dev and test files in `d`."""
  rng = random.Random(2)
  files = {}
  for split, n in (('train', 160), ('dev', 32), ('test', 32)):
    files[split] = d / f'{split}.txt'
    files[split].write_text(conll_text(rng, n))
  return files


@pytest.fixture(scope='module')
def conll_runs(start_dir, tmp_path_factory):
  """CoNLL tagging, 3 epochs: (files, workdir of the bucketed run, its results, the
  full-length run's results)."""
  d = tmp_path_factory.mktemp('conll')
  files = conll_files(d)
  cut, _, full = bucketed_and_full('conll', start_dir, {
      f'data.{s}_file': str(p) for s, p in files.items()}, d)
  return files, d / 'cut', cut, full


def test_conll_token_tagging(conll_runs):
  files, workdir, results, _ = conll_runs
  dev = results['splits']['dev']
  assert dev['headline_metric'] == 'entity_f1' and results['baseline_kind'] == 'majority-tag'
  assert dev['baseline']['f1'] == 0.0  # all O: no entity found
  scores = results['runs'][0]['scores']
  assert scores['dev']['f1'] >= 0.8 and scores['test']['f1'] >= 0.8, scores
  export = os.path.join(workdir, 'hf_export')
  model, _ = export_matches_ours(export, transformers.AutoModelForTokenClassification,
                                 encode(export, ['alice went to rome with bob']))
  assert model.config.id2label[1] == 'B-PER' and model.config.num_labels == 9


def squad_json(rng, n, prefix):
  """Who-went-where questions over two-sentence contexts (SQuAD 1.1 JSON)."""
  paragraphs = []
  for i in range(n):
    names, cities = rng.sample(['alice', 'bob'], 2), rng.sample(['paris', 'rome'], 2)
    filler = ' '.join(rng.choice(FILLER) for _ in range(rng.randint(2, 5)))
    context = (f'{filler} . {names[0]} went to {cities[0]} . {names[1]} went to '
               f'{cities[1]} .')
    k = rng.randrange(2)
    start = context.index(f'{names[k]} went to {cities[k]}')
    paragraphs.append({'context': context, 'qas': [{
        'id': f'{prefix}{i}', 'question': f'who went to {cities[k]} ?',
        'answers': [{'text': names[k], 'answer_start': start}]}]})
  return json.dumps({'version': '1.1', 'data': [{'title': 't', 'paragraphs': paragraphs}]})


def test_glue_task_writes_leaderboard_predictions(start_dir, tmp_path):
  """SST-2's files in GLUE's layout: GLUE's metrics on dev, and the test split (no labels)
  predicted into the leaderboard's SST-2.tsv. The first epoch of the classification runs'
  schedule (192 rows, 3 epochs): their programs, loaded from the compilation cache."""
  rng = random.Random(4)
  glue_dir = tmp_path / 'SST-2'
  glue_dir.mkdir()
  for split, n in (('train', 192), ('dev', 16)):
    write_table(glue_dir / f'{split}.tsv', [(t, int(p)) for t, p in sentences(rng, n)])
  test = [(i, t) for i, (t, _) in enumerate(sentences(rng, 20))]
  write_table(glue_dir / 'test.tsv', test, header=('index', 'sentence'))
  workdir = str(tmp_path / 'run')
  results = finetune.run(config('sst2', start_dir, **{
      'data.glue_dir': str(glue_dir), 'train.stop_after_epoch': 1}), workdir)
  dev = results['runs'][0]['scores']['dev']
  assert set(dev) == {'accuracy', 'headline', 'score'}
  assert list(results['splits']) == ['dev']  # the unlabelled test split is predicted only
  path = os.path.join(workdir, 'seed_0', 'glue_submission', 'SST-2.tsv')
  assert results['prediction_files'] == [path]
  lines = open(path).read().splitlines()
  assert lines[0] == 'index\tprediction' and len(lines) == 21
  assert {line.split('\t')[1] for line in lines[1:]} <= {'0', '1'}
  assert [int(line.split('\t')[0]) for line in lines[1:]] == list(range(20))


# ----------------------------------------------------------------------------- progress, CLI


def test_progress_writes_whole_lines_when_not_a_terminal(monkeypatch):
  out = io.StringIO()
  bar = LineProgress(total=10, desc='seed 0', unit='step', interval=0.0, file=out)
  for _ in range(10):
    bar.update(1)
    bar.set_postfix(loss='0.5000', refresh=False)
  bar.write('seed 0 epoch 1: dev accuracy=1.0000')
  bar.close()
  text = out.getvalue()
  assert '\r' not in text and text.endswith('\n')
  lines = text.splitlines()  # one per update (interval 0), the written one, close()'s
  assert len(lines) == 12 and lines[0].startswith('seed 0: 1/10 step (10%), ')
  assert lines[9].startswith('seed 0: 10/10 step (100%)') and lines[9].endswith(' loss=0.5000')
  assert lines[10] == 'seed 0 epoch 1: dev accuracy=1.0000'
  monkeypatch.setattr(sys, 'stderr', out)  # not a terminal
  assert isinstance(progress_bar(10), LineProgress)

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  monkeypatch.setattr(sys, 'stderr', Terminal())
  assert not isinstance(progress_bar(10), LineProgress)


def run_cli(workdir, *args):
  env = cpu_env(devices=jax.device_count())  # the worker's: its in-process programs serve it
  env.pop('GLIBC_TUNABLES', None)  # the command's own allocator settings, as a user's run has
  cmd = [sys.executable, '-m', 'bert_jax.finetune', f'--workdir={workdir}', *args]
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_cli_trains_with_line_progress_and_reports_bad_input_in_one_line(start_dir, tmp_path):
  """The command, on the worker's devices with the classification runs' config for their
  first epoch (their programs, from the compilation cache): whole progress lines, the report
  on stdout, an unlabelled test file predicted; then a bad file named in one line, no
  traceback."""
  files = classification_files(tmp_path)
  unlabelled = write_table(tmp_path / 'unlabelled.tsv', [('good film',), ('awful plot',)],
                           header=('sentence',))
  out = run_cli(tmp_path / 'run', '--config=configs/finetune.py:generic', f'--init={start_dir}',
                f'--config.data.train_file={files["train"]}',
                f'--config.data.dev_file={files["dev"]}', f'--config.data.test_file={unlabelled}',
                '--config.train.stop_after_epoch=1', '--config.train.global_batch_size=16',
                '--config.train.eval_batch_size=32', '--config.optimizer.learning_rate=5e-4',
                '--config.data.max_seq_length=32', '--config.export=False', '--config.seeds=2')
  assert out.returncode == 0, out.stderr[-3000:]
  assert '\r' not in out.stderr and 'seed 0 epoch 1: dev accuracy=' in out.stderr
  # Each seed reports the process's peak memory so far: the second reuses the first's
  # programs and buffers, so it may not grow the peak by more than a fifth.
  peaks = [r['peak_rss_mib'] for r in read_json(tmp_path / 'run' / 'results.json')['runs']]
  assert len(peaks) == 2 and 0 < peaks[0] <= peaks[1] <= 1.2 * peaks[0], peaks
  assert re.search(r'seed 0: 12/\d+ step \(\d+%\)', out.stderr), out.stderr[-3000:]
  # The log is the run's own lines: none of Orbax's INFO lines about every save and restore.
  assert 'orbax' not in out.stderr.lower() and len(out.stderr.splitlines()) < 40, out.stderr
  assert out.stdout.startswith('# generic from ') and '| majority-class baseline |' in out.stdout
  predictions = tmp_path / 'run' / 'seed_0' / 'predictions' / 'test.tsv'
  assert f'Test predictions (best epoch): {predictions}' in out.stdout
  lines = predictions.read_text().splitlines()
  assert lines[0] == 'index\tprediction' and [line.split('\t')[0] for line in lines[1:]] == [
      '0', '1'] and {line.split('\t')[1] for line in lines[1:]} <= {'neg', 'pos'}

  # Task data is checked before the start point loads: a bad file is named first.
  out = run_cli(tmp_path / 'bad', '--config=configs/finetune.py:generic', '--init=/nope/start',
                '--config.data.train_file=/nope/train.tsv', '--config.data.dev_file=/nope/d.tsv')
  assert out.returncode != 0
  assert 'error: /nope/train.tsv: no such file' in out.stderr
  assert 'Traceback' not in out.stderr


def pod_flags(files, start_dir) -> list[str]:
  """The pod's flags for conll_runs' bucketed run (dropout 0, 3 epochs, no export)."""
  return ['--config=configs/finetune.py:conll', f'--init={start_dir}',
          f'--config.data.train_file={files["train"]}', f'--config.data.dev_file={files["dev"]}',
          f'--config.data.test_file={files["test"]}', '--config.train.num_epochs=3',
          '--config.data.max_seq_length=32', '--config.train.global_batch_size=16',
          '--config.train.eval_batch_size=32', '--config.optimizer.learning_rate=5e-4',
          '--config.model.hidden_dropout=0.0', '--config.model.attention_dropout=0.0']


def test_two_processes_fine_tune_exactly_as_one(start_dir, conll_runs, tmp_path):
  """`MODULE=bert_jax.finetune launch/local_pod.sh 2` (2 processes x 2 devices) against one
  process (test_conll_token_tagging's run in this one, on its devices: the process boundary
  is the pod's claim, not the reference's): the same train losses per epoch and the same dev
  and test scores. Each process feeds its half of every global batch (cut to the length
  bucket of the whole batch) and the token predictions are gathered from both. Dropout 0:
  the two layouts would draw other dropout masks."""
  files, _, one, _ = conll_runs
  env = dict(os.environ, MODULE='bert_jax.finetune', DEVICES='2', PYTHON=sys.executable,
             PORT=str(free_port()))
  two = subprocess.run(['bash', 'launch/local_pod.sh', '2', f'--workdir={tmp_path / "two"}',
                        *pod_flags(files, start_dir), '--config.export=False'], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
  assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
  assert '| majority-tag baseline |' in two.stdout  # process 0's report
  b = read_json(tmp_path / 'two' / 'results.json')
  assert len(one['runs']) == len(b['runs']) == 1
  ra, rb = one['runs'][0], b['runs'][0]
  # Equal to float32 round-off (the gradient all-reduce crosses processes: ~1e-8 observed).
  np.testing.assert_allclose([h['train_loss'] for h in rb['history']],
                             [h['train_loss'] for h in ra['history']], rtol=1e-5)
  assert rb['scores'] == ra['scores'] and rb['best_epoch'] == ra['best_epoch']
  assert ra['scores']['dev']['f1'] >= 0.8  # it learnt: the comparison is not vacuous


def test_two_processes_agree_on_a_notice_that_arrives_at_the_end_of_a_seed(start_dir, tmp_path):
  """SIGTERM to the non-chief of two processes once seed 0 has logged its last step of 3
  epochs (its final epoch end, or seed 1's start, still to come; two epoch ends with their
  checkpoints and the chief's export already done): one preemption counter spans the seeds,
  so both hosts agree on a stop, save and exit 0. With a counter that restarted at every seed,
  or with orbax's saves also calling JAX's sync point with their step (failed 3 of 4 runs
  before checkpointing._Manager), they never agreed and ran on to the end."""
  files = classification_files(tmp_path)
  workdir = tmp_path / 'two'
  flags = ['--config=configs/finetune.py:generic', f'--init={start_dir}',
           f'--config.data.train_file={files["train"]}', f'--config.data.dev_file={files["dev"]}',
           f'--config.data.test_file={files["test"]}', '--config.train.num_epochs=3',
           '--config.data.max_seq_length=32', '--config.train.global_batch_size=16',
           '--config.train.log_every=1', '--config.seeds=2']
  env = dict(os.environ, MODULE='bert_jax.finetune', DEVICES='2', PYTHON=sys.executable,
             PORT=str(free_port()), JAX_PLATFORMS='cpu')
  pod = subprocess.Popen(['bash', 'launch/local_pod.sh', '2', f'--workdir={workdir}', *flags],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
  try:
    metrics, deadline = workdir / 'seed_0' / 'metrics.jsonl', time.time() + 300
    last = 36  # 3 epochs of 192 rows / 16
    while not (metrics.exists() and f'"step": {last},' in metrics.read_text()):
      assert pod.poll() is None and time.time() < deadline, pod.stdout.read()[-3000:]
      time.sleep(0.02)
    os.kill(_finetune_pid(workdir, 1), signal.SIGTERM)
    out, _ = pod.communicate(timeout=300)
  finally:
    if pod.poll() is None:
      os.killpg(pod.pid, signal.SIGKILL)
  assert pod.returncode == 0, out[-3000:]
  saved = []
  for i in (0, 1):
    log = (workdir / 'logs' / f'process_{i}.log').read_text()
    found = re.findall(r'preemption notice: seed (\d+) saved step (\d+)', log)
    assert len(found) == 1, log[-3000:]
    saved.append(found[0])
  assert saved[0] == saved[1], saved
  print(f'SIGTERM to process 1 after seed 0\'s last step: both saved seed {saved[0][0]} at '
        f'step {saved[0][1]}')


def _finetune_pid(workdir, index) -> int:
  want = {f'--workdir={workdir}', f'--process_id={index}', 'bert_jax.finetune'}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        if want <= set(f.read().decode(errors='replace').split('\0')):
          return int(pid)
    except OSError:
      continue
  raise AssertionError(f'process {index} of {workdir} not found')


# ----------------------------------------------------------------------------- bad input


@pytest.mark.multi_device
def test_bad_input_errors_name_the_field_and_the_fix(start_dir, tmp_path):
  files = classification_files(tmp_path)
  run = lambda **kw: finetune.run(generic_config(files, start_dir, **kw), str(tmp_path / 'w'))
  with pytest.raises(FileNotFoundError, match='nope.tsv: no such file'):
    run(**{'data.train_file': str(tmp_path / 'nope.tsv')})
  empty = write_table(tmp_path / 'empty.tsv', [])
  with pytest.raises(ValueError, match='empty.tsv: no examples'):
    run(**{'data.dev_file': empty})
  with pytest.raises(ValueError, match="unknown label 'maybe'"):
    run(**{'data.dev_file': write_table(tmp_path / 'odd.tsv', [('a film', 'maybe')])})
  with pytest.raises(ValueError, match='data.dev_file is empty: set --config.data.dev_file'):
    run(**{'data.dev_file': ''})
  with pytest.raises(ValueError, match='no start point: pass --init'):
    run(init='')
  with pytest.raises(ValueError, match='max_seq_length=1024 exceeds .* max_position_embeddings'
                                       '=512'):
    run(**{'data.max_seq_length': 1024})
  with pytest.raises(ValueError, match='train.global_batch_size=12 must be a positive multiple of 8'):
    run(**{'train.global_batch_size': 12})
  with pytest.raises(ValueError, match='config.seeds=0: need at least one run'):
    run(seeds=0)
  assert finetune.seed_list(3, 5) == [5, 6, 7] and finetune.seed_list((1, 7), 0) == [1, 7]
  with pytest.raises(ValueError, match='unknown task'):
    finetune_configs.get_config('glue')


def test_a_start_points_head_with_other_labels_is_refused(start_dir, tmp_path):
  start = start_points.load_start_point(start_dir)
  head = heads.Head(heads.SEQUENCE, num_labels=3, labels=('neg', 'neu', 'pos'))
  _, params = start_points.init_head_params(start, head, rng=jax.random.key(0))
  three_way = hf_heads.save_finetuned(str(tmp_path / 'three'), start.cfg, head, params,
                                      tokenizer=start.tokenizer)
  files = classification_files(tmp_path)
  with pytest.raises(ValueError, match=r"head was trained with labels \['neg', 'neu', 'pos'\], "
                                       r"but task generic has labels \['neg', 'pos'\]; pass "
                                       '--config.fresh_head=True'):
    finetune.run(generic_config(files, three_way), str(tmp_path / 'w'))
  records = registry.TaskRecords('generic', 'classification', [], [], ('neg', 'pos'))
  assert finetune_tasks.reconcile_labels(records, head, three_way, fresh_head=True) == (
      'neg', 'pos')
  flipped = heads.Head(heads.SEQUENCE, num_labels=2, labels=('pos', 'neg'))
  assert finetune_tasks.reconcile_labels(records, flipped, 'x', fresh_head=False) == (
      'pos', 'neg')  # the head's own order, so its rows keep their meaning


def test_squad_v1_config_refuses_a_v2_file(start_dir, tmp_path):
  data = json.loads(squad_json(random.Random(5), 4, 'q'))
  data['data'][0]['paragraphs'][0]['qas'][0].update(answers=[], is_impossible=True)
  path = tmp_path / 'v2.json'
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match='1 questions have no answer .*use configs/finetune.py:'
                                       'squad_v2'):
    finetune.run(config('squad', start_dir, **{'data.train_file': str(path),
                                               'data.dev_file': str(path)}), str(tmp_path))


# ----------------------------------------------------------------------------- task plumbing


def test_mnli_splits_scores_in_a_heads_label_order_and_leaderboard_files(start_dir, tmp_path):
  """MNLI from the GLUE root: matched and mismatched dev, both test files and the AX
  diagnostic; with a start point's label order, GLUE's metrics still see GLUE's ids."""
  root = tmp_path / 'glue'
  (root / 'MNLI').mkdir(parents=True)
  (root / 'diagnostic').mkdir()
  names = ('contradiction', 'entailment', 'neutral')
  labelled = [(i, f'a film {i}', 'the plot', names[i % 3]) for i in range(6)]
  unlabelled = [(i, 'a film', 'the plot') for i in range(4)]
  for split in ('train', 'dev_matched', 'dev_mismatched'):
    write_table(root / 'MNLI' / f'{split}.tsv', labelled,
                ('index', 'sentence1', 'sentence2', 'gold_label'))
  for path in ('MNLI/test_matched', 'MNLI/test_mismatched', 'diagnostic/diagnostic'):
    write_table(root / f'{path}.tsv', unlabelled, ('index', 'sentence1', 'sentence2'))
  c = config('mnli', start_dir, **{'data.glue_dir': str(root)})
  records = registry.read_task(c)
  assert [(s.name, s.role, s.glue_name) for s in records.splits] == [
      ('dev_matched', 'dev', 'MNLI-m'), ('dev_mismatched', 'dev', 'MNLI-mm'),
      ('test_matched', 'test', 'MNLI-m'), ('test_mismatched', 'test', 'MNLI-mm'),
      ('test_ax', 'test', 'AX')]
  order = ('neutral', 'entailment', 'contradiction')  # as a start point's head might have it
  tok = start_points.load_start_point(start_dir).tokenizer
  task = finetune_tasks.featurize(records, order, tok, c.data)
  dev = task.evals[0]
  gold = np.eye(3)[dev.arrays['labels']]
  assert task.score(dev, {'logits': gold})['accuracy'] == 1.0
  assert task.score(dev, {'logits': np.roll(gold, 1, axis=1)})['accuracy'] == 0.0
  assert task.baseline(dev)['accuracy'] == pytest.approx(1 / 3)
  assert task.headline_name(dev) == 'accuracy' and task.select_split is dev
  path = task.write_predictions(task.evals[4], {'logits': np.eye(3)[[0, 1, 2, 0]]},
                                str(tmp_path / 'seed_0'))
  assert path == str(tmp_path / 'seed_0' / 'glue_submission' / 'AX.tsv')
  assert open(path).read().splitlines()[1:] == [
      '0\tneutral', '1\tentailment', '2\tcontradiction', '3\tneutral']


def test_squad_v2_no_answer_baseline_and_positions(start_dir, tmp_path):
  data = json.loads(squad_json(random.Random(6), 8, 'q'))
  for p in data['data'][0]['paragraphs'][:2]:  # two unanswerable questions of eight
    p['qas'][0].update(answers=[], is_impossible=True)
  path = tmp_path / 'v2.json'
  path.write_text(json.dumps(data))
  c = config('squad_v2', start_dir, **{'data.train_file': str(path), 'data.dev_file': str(path),
                                       'data.max_seq_length': 48, 'data.max_query_length': 16})
  records = registry.read_task(c)
  task = finetune_tasks.featurize(records, (), start_points.load_start_point(start_dir).tokenizer,
                                  c.data)
  assert task.head.task == heads.SPAN and task.squad_v2
  starts = task.train['start_positions']
  assert (starts[:2] == 0).all() and (starts[2:] > 0).all()  # impossible -> [CLS]
  baseline = task.baseline(task.evals[0])
  assert baseline['exact'] == 0.25 and baseline['NoAns_exact'] == 1.0  # 0-1, as every task
  assert baseline['HasAns_exact'] == 0.0


# ----------------------------------------------------------------------------- POS, AX, part of a file

POS_OF = {'the': 'DT', 'a': 'DT', 'this': 'DT', 'that': 'DT', 'film': 'NN', 'plot': 'NN',
          'actor': 'NN', 'scene': 'NN', 'story': 'NN', 'music': 'NN', 'is': 'VBZ', 'was': 'VBD',
          'went': 'VBD', 'and': 'CC', 'it': 'PRP', 'of': 'IN', 'with': 'IN', 'very': 'RB',
          'quite': 'RB', 'long': 'JJ', 'short': 'JJ', 'new': 'JJ', 'old': 'JJ', 'good': 'JJ',
          'great': 'JJ', 'bad': 'JJ', 'awful': 'JJ', 'alice': 'NNP', 'bob': 'NNP',
          'paris': 'NNP', 'rome': 'NNP', 'who': 'WP', 'to': 'TO', '?': '.', '.': '.'}


def pos_sentences(rng, n):
  """Sentences of `word TAG` pairs, the tag fixed by the word (Penn Treebank tags)."""
  words = sorted(POS_OF)
  return [[(w, POS_OF[w]) for w in rng.choices(words, k=rng.randint(3, 8))] for _ in range(n)]


def test_pos_tags_are_scored_by_token_accuracy_against_the_majority_tag(start_dir, tmp_path):
  """A 2-column POS file end to end: bare tags get token accuracy (no entity F1), and the
  baseline is the majority training tag's token accuracy; max_train_examples trains on the
  first sentences only. In bfloat16 (`model.dtype`): it learns as well."""
  rng = random.Random(7)
  data, files = {}, {}
  for split, n in (('train', 200), ('dev', 32), ('test', 32)):
    data[split] = pos_sentences(rng, n)
    files[split] = tmp_path / f'{split}.pos'
    files[split].write_text('\n\n'.join('\n'.join(f'{w} {t}' for w, t in s)
                                        for s in data[split]) + '\n')
  workdir = str(tmp_path / 'run')
  results = finetune.run(config('conll', start_dir, **{
      **{f'data.{s}_file': str(p) for s, p in files.items()},
      'data.max_train_examples': 128, 'train.num_epochs': 2, 'export': False,
      'model.dtype': 'bfloat16'}), workdir)
  counts = collections.Counter(t for s in data['train'][:128] for _, t in s)
  majority = min(counts, key=lambda t: (-counts[t], t))  # ties: the first label (sorted)
  for split in ('dev', 'test'):
    gold = [t for s in data[split] for _, t in s]
    expected = gold.count(majority) / len(gold)
    summary = results['splits'][split]
    assert summary['headline_metric'] == 'token_accuracy'
    assert summary['baseline'] == {'token_accuracy': pytest.approx(expected),
                                   'headline': pytest.approx(expected)}
    assert 0.1 < expected < 0.4
  assert results['baseline_kind'] == 'majority-tag'
  run = results['runs'][0]
  assert set(run['scores']['dev']) == {'token_accuracy', 'headline'}
  assert run['scores']['dev']['token_accuracy'] >= 0.9, run['scores']
  assert run['scores']['test']['token_accuracy'] >= 0.9, run['scores']
  assert run['history'][0]['step'] == 128 // 16  # the first 128 sentences, batch 16
  md = open(os.path.join(workdir, 'results.md')).read()
  assert 'dev token_accuracy' in md and 'entity' not in md


def test_entity_tags_report_entity_f1_and_token_accuracy(start_dir, tmp_path):
  path = tmp_path / 'ner.txt'
  path.write_text('alice B-PER\nwent O\nto O\nrome B-LOC\n\nbob B-PER\nsmith I-PER\n')
  c = config('conll', start_dir, **{'data.train_file': str(path), 'data.dev_file': str(path)})
  records = registry.read_task(c)
  task = finetune_tasks.featurize(records, records.labels,
                                  start_points.load_start_point(start_dir).tokenizer, c.data)
  dev = task.evals[0]
  assert task.kind.entity_tags(task) and task.headline_name(dev) == 'entity_f1'
  # 5 of 6 words right; "bob smith" is cut short, so 2 of 3 entities match (P = R = 2/3).
  got = task.score_predictions(dev, [['B-PER', 'O', 'O', 'B-LOC'], ['B-PER', 'O']])
  assert got['token_accuracy'] == pytest.approx(5 / 6)
  assert got['headline'] == got['f1'] == pytest.approx(2 / 3)


def test_ax_is_found_beside_mnli_named_by_ax_file_or_warned_about(start_dir, tmp_path, caplog):
  root = tmp_path / 'glue_data'
  (root / 'MNLI').mkdir(parents=True)
  names = ('contradiction', 'entailment', 'neutral')
  for split in ('train', 'dev_matched', 'dev_mismatched'):
    write_table(root / 'MNLI' / f'{split}.tsv', [(i, 'a film', 'the plot', names[i % 3])
                                                  for i in range(6)],
                ('index', 'sentence1', 'sentence2', 'gold_label'))
  c = config('mnli', start_dir, **{'data.glue_dir': str(root / 'MNLI')})
  with caplog.at_level('WARNING'):
    records = registry.read_task(c)
  assert [s.name for s in records.splits] == ['dev_matched', 'dev_mismatched']
  warnings = [r for r in caplog.records if r.levelname == 'WARNING' and 'AX' in r.message]
  assert len(warnings) == 1 and 'glue_data/AX/AX.tsv' in warnings[0].message
  assert '--config.data.ax_file' in warnings[0].message
  (root / 'AX').mkdir()
  write_table(root / 'AX' / 'AX.tsv', [(i, 'a film', 'the plot') for i in range(3)],
              ('index', 'sentence1', 'sentence2'))
  records = registry.read_task(c)  # the sibling of glue_data/MNLI
  ax = records.splits[-1]
  assert (ax.name, ax.role, ax.glue_name, len(ax.records)) == ('test_ax', 'test', 'AX', 3)
  write_table(tmp_path / 'mine.tsv', [(9, 'a', 'b')], ('index', 'sentence1', 'sentence2'))
  c.data.ax_file = str(tmp_path / 'mine.tsv')
  assert [e.index for e in registry.read_task(c).splits[-1].records] == [9]
  c.data.ax_file = str(tmp_path / 'nope.tsv')
  with pytest.raises(FileNotFoundError, match=r'nope.tsv: no such file \(GLUE AX test\)'):
    registry.read_task(c)


def test_max_train_examples_trains_on_the_first_records(start_dir, tmp_path):
  files = classification_files(tmp_path)
  full = registry.read_task(generic_config(files, start_dir))
  part = registry.read_task(generic_config(files, start_dir,
                                                 **{'data.max_train_examples': 10}))
  assert len(full.train) == 192 and part.train == full.train[:10]
  assert part.labels == full.labels and part.splits[0].records == full.splits[0].records
  more = generic_config(files, start_dir, **{'data.max_train_examples': 500})
  assert registry.read_task(more).train == full.train
  conll_file = tmp_path / 'ner.txt'
  conll_file.write_text(conll_text(random.Random(1), 12))
  c = config('conll', start_dir, **{'data.train_file': str(conll_file),
                                    'data.dev_file': str(conll_file),
                                    'data.max_train_examples': 5})
  records = registry.read_task(c)
  assert records.train == records.splits[0].records[:5]  # sentences, in file order
  with pytest.raises(ValueError, match=r'data.max_train_examples=-1: expected 0 \(all\)'):
    registry.read_task(generic_config(files, start_dir, **{'data.max_train_examples': -1}))


# ----------------------------------------------------------------------------- SWAG


def swag_csv(path, rng, n, labelled=True):
  """SWAG's released layout (pandas' index column first); the gold ending is the one with a
  positive word, the three others have negative ones."""
  header = ['', 'video-id', 'fold-ind', 'startphrase', 'sent1', 'sent2', 'gold-source',
            'ending0', 'ending1', 'ending2', 'ending3'] + (['label'] if labelled else [])
  lines = [','.join(header)]
  for i in range(n):
    sent1 = ' '.join(rng.choice(FILLER) for _ in range(rng.randint(3, 6))) + ' .'
    sent2 = rng.choice(['it', 'the actor', 'this story'])
    gold = rng.randrange(4)
    endings = [' '.join([rng.choice(FILLER), rng.choice(['good', 'great'] if k == gold else
                                                       ['bad', 'awful']), rng.choice(FILLER)])
               for k in range(4)]
    row = [str(i), f'v{i}', str(i), f'{sent1} {sent2}', sent1, sent2, 'gold', *endings]
    lines.append(','.join(row + ([str(gold)] if labelled else [])))
  path.write_text('\n'.join(lines) + '\n')
  return str(path)


def test_swag_multiple_choice_learns_reports_chance_and_exports(start_dir, tmp_path):
  """configs/finetune.py:swag on SWAG-layout CSVs: [N, 4, S] batches through the loop,
  accuracy far above the 0.25 chance baseline, test.csv (no labels) predicted, and the export
  loads in AutoModelForMultipleChoice with our logits and our dev accuracy."""
  rng = random.Random(7)
  files = {'train_file': swag_csv(tmp_path / 'train.csv', rng, 64),
           'dev_file': swag_csv(tmp_path / 'val.csv', rng, 32),
           'test_file': swag_csv(tmp_path / 'test.csv', rng, 8, labelled=False)}
  workdir = str(tmp_path / 'run')
  results = finetune.run(config('swag', start_dir, **{'train.num_epochs': 2, **{
      f'data.{k}': v for k, v in files.items()}}), workdir)
  saved = read_json(os.path.join(workdir, 'results.json'))
  assert saved['baseline_kind'] == 'chance' and list(saved['splits']) == ['dev']
  dev = saved['splits']['dev']
  assert dev['headline_metric'] == 'accuracy'
  assert dev['baseline'] == {'accuracy': 0.25, 'headline': 0.25}
  run = saved['runs'][0]
  assert run['scores']['dev']['accuracy'] >= 0.75, run['history']  # learnt, far above chance
  assert '| chance baseline | | 0.2500 |' in open(os.path.join(workdir, 'results.md')).read()
  lines = open(results['prediction_files'][0]).read().splitlines()
  assert lines[0] == 'index\tprediction' and len(lines) == 9
  assert {line.split('\t')[1] for line in lines[1:]} <= {'0', '1', '2', '3'}

  # The export, tokenized as run_swag.py does (sent1, f'{sent2} {ending}'), flattened to
  # [32 * 4, S] and back, gives our logits (export_matches_ours) and our dev accuracy.
  with open(files['dev_file']) as f:
    rows = list(csv.DictReader(f))
  firsts = [r['sent1'] for r in rows for _ in range(4)]
  seconds = [f'{r["sent2"]} {r[f"ending{k}"]}' for r in rows for k in range(4)]
  enc = {k: v.reshape(len(rows), 4, -1) for k, v in encode(run['export'], firsts, seconds).items()}
  _, out = export_matches_ours(run['export'], transformers.AutoModelForMultipleChoice, enc)
  labels = np.array([int(r['label']) for r in rows])
  assert np.mean(out.logits.numpy().argmax(-1) == labels) == run['scores']['dev']['accuracy']


# ----------------------------------------------------------------------------- SQuAD reporting


def test_squad_spans_learn_score_the_test_file_on_every_line_and_export(start_dir, tmp_path,
                                                                         capsys):
  """SQuAD v1.1 end to end: the span loss falls, dev and the test file are scored (the test
  at the best epoch), F1 and EM are on every epoch line and in results.md, an old checkpoint
  with percentage scores is refused, and the export gives our span logits in transformers."""
  rng = random.Random(3)
  files = {}
  for split, n in (('train', 96), ('dev', 24), ('test', 16)):
    files[split] = tmp_path / f'{split}.json'
    files[split].write_text(squad_json(rng, n, split))
  workdir = tmp_path / 'run'
  squad_config = lambda: config('squad', start_dir, **{
      'data.train_file': str(files['train']), 'data.dev_file': str(files['dev']),
      'data.test_file': str(files['test']), 'data.max_seq_length': 48,
      'data.doc_stride': 16, 'data.max_query_length': 16})
  results = finetune.run(squad_config(), str(workdir))
  dev = results['splits']['dev']
  assert dev['headline_metric'] == 'f1' and results['baseline_kind'] == 'no-answer'
  assert dev['baseline']['exact_match'] == 0.0 and dev['baseline']['f1'] == 0.0
  test = results['splits']['test']
  assert test['role'] == 'test' and test['headline_metric'] == 'f1'
  assert test['baseline']['exact_match'] == test['baseline']['f1'] == 0.0
  run = results['runs'][0]
  history = run['history']
  assert history[-1]['train_loss'] < history[0]['train_loss'] - 0.5, history
  best = history[run['best_epoch'] - 1]
  assert run['scores']['test'] == best['scores']['test']  # scored at the best epoch
  for split in ('dev', 'test'):
    scores = run['scores'][split]
    assert 0 <= scores['exact_match'] <= scores['f1'] <= 1 and scores['headline'] == scores['f1']
  # Every epoch line: F1 (the headline), its baseline, then EM; the best epoch's test too.
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith('seed 0 epoch ')]
  assert len(lines) == len(history) == 3, err[-3000:]
  number = r'[01]\.\d{4}'
  for line in lines:
    assert re.search(rf'dev f1={number} \(no-answer baseline 0\.0000\) exact_match={number}',
                     line), line
  assert re.search(rf'test f1={number} \(no-answer baseline 0\.0000\) exact_match={number}',
                   lines[0]), lines[0]  # epoch 1 is the best so far
  md = (workdir / 'results.md').read_text()
  assert ('| seed | best epoch | dev f1 | dev exact_match | test f1 | test exact_match |'
          in md), md
  assert '| no-answer baseline | | 0.0000 | 0.0000 | 0.0000 | 0.0000 |' in md, md
  assert f'| 0 | {run["best_epoch"]} | {run["scores"]["dev"]["f1"]:.4f} | ' in md

  # A checkpoint written when SQuAD scores were percentages (no scores_version) is refused,
  # not compared with 0-1 scores.
  ckpt = os.path.join(workdir, 'seed_0', 'checkpoints')
  progress = os.path.join(ckpt, max(os.listdir(ckpt), key=int), 'progress', 'metadata')
  saved = read_json(progress)
  del saved['scores_version']
  with open(progress, 'w') as f:
    json.dump(saved, f)
  with pytest.raises(ValueError, match='SQuAD scores were percentages.*new --workdir'):
    finetune.run(squad_config(), str(workdir))
  export = os.path.join(workdir, 'hf_export')
  export_matches_ours(export, transformers.AutoModelForQuestionAnswering,
                      encode(export, ['who went to paris ?'], ['bob went to paris .'], 48))


def test_squad_v2_task_decodes_with_the_tokenizers_casing_and_reports_best_thresholds(
    start_dir, tmp_path):
  """A cased SentencePiece model's answers keep their case through the task (no casing is
  guessed between the tokenizer and the decoding); SQuAD 2.0 scores carry evaluate-v2.0.py's
  best_exact / best_f1 (as fractions) and their null thresholds."""
  sentences = ["In the final Steve Smith's bat broke .", 'Alice Brown went to Paris .',
               'Who went to Rome ?', 'Whose bat broke ?', 'Who went to Paris ?'] * 20
  tok = SentencePieceTokenizer.train(sentences, 80, str(tmp_path / 'sp'), lowercase=False)
  assert tok.do_lower_case is False
  context = "In the final Steve Smith's bat broke . Alice Brown went to Paris ."
  qas = [('bat', 'Whose bat broke ?', 'Steve Smith'), ('paris', 'Who went to Paris ?',
                                                         'Alice Brown'),
         ('rome', 'Who went to Rome ?', None)]
  data = {'data': [{'paragraphs': [{'context': context, 'qas': [
      {'id': f'{q}{i}', 'question': question, 'is_impossible': answer is None,
       'answers': [] if answer is None else [
           {'text': answer, 'answer_start': context.index(answer)}]}
      for q, question, answer in qas]} for i in range(4)]}]}
  path = tmp_path / 'v2.json'
  path.write_text(json.dumps(data))
  c = config('squad_v2', start_dir, **{'data.train_file': str(path), 'data.dev_file': str(path),
                                       'data.max_seq_length': 48, 'data.max_query_length': 16})
  task = finetune_tasks.featurize(registry.read_task(c), (), tok, c.data)
  split = task.evals[0]
  rng = np.random.default_rng(0)
  outputs = {k: rng.normal(0, 2, (len(split.features), 48))
             for k in ('start_logits', 'end_logits')}
  for k, f in enumerate(split.features):  # gold spans (or [CLS]) well ahead of the rest
    outputs['start_logits'][k, f.start_position] += 6
    outputs['end_logits'][k, f.end_position] += 6
  predictions = task.predictions(split, outputs)
  assert predictions['bat0'] == 'Steve Smith'  # not "Steve Smith's"
  scores = task.score(split, outputs)
  found = squad_answers.squad_predictions(
      split.records, split.features, outputs['start_logits'], outputs['end_logits'], tok,
      version_2_with_negative=True)
  gold = squad.gold_answers(split.records)
  official = metrics.squad_evaluate(gold, found.predictions, version_2=True)
  best = metrics.squad_v2_best_thresholds(gold, found.predictions, found.null_odds)
  assert scores['exact'] == pytest.approx(official['exact'] / 100)
  assert scores['headline'] == scores['f1'] == pytest.approx(official['f1'] / 100)
  for k in ('best_exact', 'best_f1'):
    assert scores[k] == pytest.approx(best[k] / 100) and 0 <= scores[k] <= 1
    assert scores[f'{k}_thresh'] == best[f'{k}_thresh']  # null odds: not rescaled
  assert scores['total'] == 12 and scores['NoAns_total'] == 4
  assert finetune_tasks.format_details(scores) == (
      f' exact={scores["exact"]:.4f} best_f1={scores["best_f1"]:.4f} (null threshold '
      f'{scores["best_f1_thresh"]:.4f}) best_exact={scores["best_exact"]:.4f} (null threshold '
      f'{scores["best_exact_thresh"]:.4f})')


def test_bucket_length_is_the_smallest_fixed_length_that_holds_the_longest_row():
  mask = np.zeros((4, 128), np.int32)
  for i, n in enumerate((5, 30, 33, 100)):
    mask[i, :n] = 1
  arrays = {'input_ids': mask.copy(), 'input_mask': mask}
  length = lambda rows, buckets=4: batching.bucket_length(arrays, np.array(rows), buckets)
  assert [length([0]), length([0, 1]), length([0, 2]), length([3, -1]), length([-1])] == [
      32, 32, 64, 128, 128]
  assert length([0], buckets=1) == 128 and length([0], buckets=16) == 8
  config = finetune_configs.get_config('mr')
  config.data.length_buckets = 0
  with pytest.raises(ValueError, match=r'data.length_buckets=0: expected 1'):
    finetune.check_batch_sizes(config)
  cut = batching.take(arrays, np.array([1, -1]), ('input_ids', 'input_mask'), 32)
  assert cut['input_ids'].shape == (2, 32) and cut['input_mask'][0].sum() == 30


@pytest.mark.parametrize('task', ['conll', 'squad'])
def test_length_buckets_train_and_predict_as_full_length_rows_do(task, request, start_dir,
                                                                 tmp_path):
  """Short rows cut to their bucket give the full-length run's losses and scores (to float
  round-off: only padding, masked out of attention, is left out), tagging and span logits
  included, which are padded back for decoding. CoNLL: test_conll_token_tagging's run against
  its first epoch with full-length rows."""
  if task == 'conll':
    *_, cut, full = request.getfixturevalue('conll_runs')
  else:
    rng = random.Random(5)
    files = {s: tmp_path / f'{s}.json' for s in ('train', 'dev')}
    for (split, path), n in zip(files.items(), (48, 24)):
      path.write_text(squad_json(rng, n, split))
    cut, _, full = bucketed_and_full('squad', start_dir, {
        **{f'data.{s}_file': str(p) for s, p in files.items()}, 'train.num_epochs': 1,
        'data.max_seq_length': 64, 'data.doc_stride': 32,  # one window each,
        'data.max_query_length': 16}, tmp_path)  # rows ending well before 64
  assert len(full['runs'][0]['history']) == 1
  a, b = full['runs'][0]['history'][0], cut['runs'][0]['history'][0]
  assert a['step'] == b['step']
  np.testing.assert_allclose(b['train_loss'], a['train_loss'], rtol=1e-5)
  for k, v in a['scores']['dev'].items():
    if isinstance(v, float):
      np.testing.assert_allclose(b['scores']['dev'][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
