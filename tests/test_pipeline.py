"""Corpus, tokenizer, instance creation, packing and the tf.data reader."""

import dataclasses
import gzip
import json
import os
import random

import numpy as np
import pytest
from input_pipeline.tf_data import tf

from input_pipeline import tfrecord
from input_pipeline.pretrain import corpus, create_pretraining_data as cpd, dataset as data_lib
from input_pipeline.pretrain import example_codec, instances as instances_lib, masking
from input_pipeline.pretrain import objectives
from input_pipeline.pretrain.instances import create_instances, MaskingConfig
from input_pipeline.tokenizer import WordPieceTokenizer

DATA = os.path.join(os.path.dirname(__file__), 'data')
VOCAB = os.path.join(DATA, 'bert_uncased_vocab.txt')
REFERENCE_128 = os.path.join(DATA, 'reference_kjv_L128_P20_d1.tfrecord')


@pytest.fixture(scope='module')
def docs():
  return list(corpus.embedded_documents())[:400]


@pytest.fixture(scope='module')
def corpus_file(tmp_path_factory, docs):
  path = str(tmp_path_factory.mktemp('corpus') / 'docs.txt')
  corpus.write_text_file(docs, path)
  return path


@pytest.fixture(scope='module')
def tokenizer():
  return WordPieceTokenizer(VOCAB, do_lower_case=True)


# ----------------------------------------------------------------------------- corpus


def test_text_files_gz_and_globs(tmp_path):
  (tmp_path / 'a.txt').write_text('One.\nTwo.\n\nThree.\n')
  with gzip.open(tmp_path / 'b.txt.gz', 'wt') as f:
    f.write('Four.\nFive.\n')
  (tmp_path / 'empty.txt').write_text('\n\n')
  stats = corpus.CorpusStats()
  got = list(corpus.read_text_files(str(tmp_path / '*'), stats=stats))
  assert got == [['One.', 'Two.'], ['Three.'], ['Four.', 'Five.']]
  assert stats.files == 3 and stats.empty_files == 1 and stats.documents == 3


def test_non_utf8_line_names_file_and_line_or_is_skipped_and_counted(tmp_path):
  path = tmp_path / 'bad.txt'
  path.write_bytes(b'Fine line.\nAnother.\n\xff\xfe broken\nLast.\n')
  with pytest.raises(ValueError, match=r'bad.txt, line 3: not UTF-8.*--skip_bad_lines'):
    list(corpus.read_text_files(str(path)))
  stats = corpus.CorpusStats()
  assert list(corpus.read_text_files(str(path), skip_bad_lines=True, stats=stats)) == [
      ['Fine line.', 'Another.', 'Last.']]
  assert stats.bad_lines == 1


def test_missing_input_is_a_clear_error():
  with pytest.raises(FileNotFoundError, match="input file '/nope/\\*.txt': no such file"):
    list(corpus.read_text_files('/nope/*.txt'))


def test_tfds_corpus_through_tfds_own_mock_data(docs, tmp_path):
  import tensorflow_datasets as tfds
  articles = [' '.join(d) for d in docs[:60]]

  def as_dataset(self, split, *args, **kwargs):
    del self, split, args, kwargs
    return tf.data.Dataset.from_tensor_slices({'text': articles, 'title': ['t'] * len(articles)})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    stats = corpus.CorpusStats()
    got = list(corpus.documents_from_flags(None, 'wikipedia/20230601.en', stats=stats))
    assert got == [corpus.split_sentences(a) for a in articles] and stats.documents == 60
    job = cpd.Job(output_file=str(tmp_path / 'wiki'), masking=MaskingConfig(), vocab_file=VOCAB,
                  tfds_name='wikipedia/20230601.en', dupe_factor=1)
    assert cpd.run(job)['instances'] > 60
    with pytest.raises(KeyError, match="has no feature 'body'.*'text'.*--tfds_feature"):
      list(corpus.documents_from_flags(None, 'wikipedia/20230601.en', tfds_feature='body'))


def test_huge_line_and_one_sentence_documents(tmp_path):
  path = tmp_path / 'odd.txt'
  huge = ' '.join(['word'] * 200_000) + '.'  # one 1 MB line, 10 windows of the job's 100k chars
  path.write_text('Alone here.\n\nAlso alone.\n\n' + huge + '\nAfter it.\n\nLast one.\n')
  docs = list(corpus.read_text_files(str(path)))
  assert [len(d) for d in docs] == [1, 1, 2, 1]
  job = cpd.Job(output_file=str(tmp_path / 'odd'), masking=MaskingConfig(), vocab_file=VOCAB,
                input_file=str(path), dupe_factor=3, window_chars=100_000)
  stats = cpd.run(job)
  assert stats['instances'] >= 12  # every document serves, one-sentence ones too
  assert stats['truncation_rate'] > 0
  batches = _read_all(data_lib.ReaderConfig(files=job.output_file, batch_size=8))
  assert max(int(b['input_mask'].sum(axis=1).max()) for b in batches) <= 128


def test_sentence_splitter():
  assert corpus.split_sentences('It works. Does it? Yes! e.g. this stays.\n\nNew para.') == [
      'It works.', 'Does it?', 'Yes! e.g. this stays.', 'New para.']


def test_embedded_corpus_is_real_prose(docs):
  words = sum(len(s.split()) for d in docs for s in d)
  assert len(docs) == 400 and words > 15_000
  assert all(len(d) >= 2 for d in docs)


# ----------------------------------------------------------------------------- tokenizer


def test_wordpiece_ids_equal_hf_bert_tokenizer_fast_on_every_line(docs, tokenizer, tmp_path):
  import transformers
  hf_tok = transformers.BertTokenizerFast(vocab=VOCAB, do_lower_case=True)
  lines = [s for d in docs for s in d] + ['Ünïcödé naïve café 東京 ﬁ tab\there', 'x' * 150]
  ours = tokenizer.encode_batch(lines)
  theirs = hf_tok(lines, add_special_tokens=False)['input_ids']
  assert ours == theirs
  # What we export is what transformers loads back.
  tokenizer.save_pretrained(str(tmp_path))
  auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert auto(lines, add_special_tokens=False)['input_ids'] == ours
  assert auto('a b')['input_ids'][0] == tokenizer.cls_id


def test_word_starts_for_whole_word_masking(tokenizer):
  ids = tokenizer.encode('tokenization unaffable')
  tokens = [tokenizer.id_to_token(i) for i in ids]
  assert tokens == ['token', '##ization', 'una', '##ffa', '##ble']
  assert tokenizer.is_word_start(ids).tolist() == [True, False, True, False, False]
  assert 103 not in tokenizer.replacement_ids and 1 not in tokenizer.replacement_ids  # [MASK], [unused0]


@pytest.mark.parametrize('model_type,lowercase', [('unigram', True), ('bpe', False)])
def test_sentencepiece_trains_and_exports_an_auto_tokenizer_that_agrees(tmp_path, docs,
                                                                         model_type, lowercase):
  import transformers
  from input_pipeline.tokenizer import SentencePieceTokenizer
  sentences = [s for d in docs for s in d]
  tok = SentencePieceTokenizer.train(sentences[:3000], 1000, str(tmp_path / 'sp'),
                                     model_type=model_type, lowercase=lowercase)
  assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
  ids = tok.encode('Return the value of the object.')
  assert ids and all(i > 4 for i in ids)
  assert tok.is_word_start(ids)[0]
  assert (tok.encode('RETURN') == tok.encode('return')) == lowercase
  loaded = SentencePieceTokenizer(str(tmp_path / 'sp.model'))
  tok.save_pretrained(str(tmp_path / 'hf'))
  auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  lines = sentences[3000:] + ['Ünïcödé “quotes” — dash…  two  spaces', 'ＦＵＬＬ ｶﾀｶﾅ\tand tab',
                              'a [MASK] here', ' lead and trail ']
  assert auto(lines, add_special_tokens=False)['input_ids'] == tok.encode_batch(lines)
  assert loaded.encode_batch(lines) == tok.encode_batch(lines)
  pair = auto('one two', 'three')
  a, b = tok.encode('one two'), tok.encode('three')
  assert pair['input_ids'] == [2] + a + [3] + b + [3]
  assert pair['token_type_ids'] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert auto.mask_token_id == 4 and auto.pad_token_id == 0


# ----------------------------------------------------------------------------- instances


def _tokenized(docs, tokenizer):
  return [[ids for ids in tokenizer.encode_batch(d) if ids] for d in docs]


def _instances(path, tokenized, cfg, tokenizer, seed, dupe_factor=1):
  """(tokens, segment ids, masked positions, labels) per instance, from either path."""
  if path == 'exact':
    return [(i.tokens, i.segment_ids, i.masked_positions, i.masked_labels)
            for i in create_instances(tokenized, cfg, tokenizer, random.Random(seed),
                                      dupe_factor)]
  m = masking.create_block(tokenized, cfg, tokenizer, seed, dupe_factor, chunk_rows=256).masked
  return [(m.input_ids[r, :n].tolist(), m.segment_ids[r, :n].tolist(),
           m.masked_lm_positions[r, :k].tolist(), m.masked_lm_ids[r, :k].tolist())
          for r, (n, k) in enumerate(zip(m.lengths, m.num_masked))]


@pytest.mark.parametrize('path', ['exact', 'vectorised'])
def test_instances_follow_the_reference_rules(docs, tokenizer, path):
  cfg = MaskingConfig(max_seq_length=128, max_predictions_per_seq=20)
  instances = _instances(path, _tokenized(docs, tokenizer), cfg, tokenizer, 1, dupe_factor=2)
  assert len(instances) > 500
  n_masked = n_mask = n_kept = n_rand = 0
  for t, segment_ids, positions, labels in instances:
    assert len(t) <= 128 and t[0] == tokenizer.cls_id
    original = list(t)
    for p, label in zip(positions, labels):
      original[p] = label
    assert original[-1] == tokenizer.sep_id and original.count(tokenizer.sep_id) >= 2
    first_sep = segment_ids.index(1) - 1
    assert original[first_sep] == tokenizer.sep_id
    assert segment_ids[:first_sep + 1] == [0] * (first_sep + 1)
    assert set(segment_ids[first_sep + 1:]) == {1}
    assert len(positions) == min(20, max(1, round(len(t) * 0.15)))
    assert positions == sorted(set(positions))
    for p, label in zip(positions, labels):
      assert label not in (tokenizer.cls_id, tokenizer.sep_id)
      n_mask += t[p] == tokenizer.mask_id
      n_kept += t[p] == label
      n_rand += t[p] not in (label, tokenizer.mask_id)
      assert t[p] in (label, tokenizer.mask_id) or t[p] in tokenizer.replacement_ids
    n_masked += len(positions)
  assert abs(n_mask / n_masked - 0.8) < 0.015
  assert abs(n_kept / n_masked - 0.1) < 0.015 and abs(n_rand / n_masked - 0.1) < 0.015


@pytest.mark.parametrize('path', ['exact', 'vectorised'])
def test_whole_word_masking_masks_whole_words(docs, tokenizer, path):
  cfg = MaskingConfig(do_whole_word_mask=True)
  whole_words = 0
  for tokens, _, positions, labels in _instances(path, _tokenized(docs[:100], tokenizer), cfg,
                                                tokenizer, 2):
    masked = set(positions)
    original = list(tokens)
    for p, label in zip(positions, labels):
      original[p] = label
    starts = tokenizer.is_word_start(original)
    for p in masked:  # a masked piece's whole word is masked: the pieces around it too
      if not starts[p] and original[p - 1] not in (tokenizer.cls_id, tokenizer.sep_id):
        assert p - 1 in masked
        whole_words += 1
      if p + 1 < len(original) and not starts[p + 1] and original[p + 1] != tokenizer.sep_id:
        assert p + 1 in masked
  assert whole_words > 50


def test_vectorised_truncation_trims_exactly_like_the_reference():
  rng, exact_rng = random.Random(0), random.Random(0)
  fronts = backs = 0
  for _ in range(3000):
    la, lb, m = rng.randint(1, 300), rng.randint(1, 300), rng.randint(2, 300)
    fa, ba, fb, bb = instances_lib.truncation(la, lb, m, rng, exact=False)
    efa, eba, efb, ebb = instances_lib.truncation(la, lb, m, exact_rng, exact=True)
    assert (fa + ba, fb + bb) == (efa + eba, efb + ebb)  # same lengths trimmed from A and B
    fronts, backs = fronts + fa + fb, backs + ba + bb
  assert abs(fronts / (fronts + backs) - 0.5) < 0.01  # each token from either end, 50/50


def test_vectorised_and_exact_paths_agree_on_statistics(docs, tokenizer):
  cfg = MaskingConfig()
  tokenized = _tokenized(docs, tokenizer)
  exact = masking.block_from_instances(
      create_instances(tokenized, cfg, tokenizer, random.Random(4), 2), cfg)
  fast = masking.create_block(tokenized, cfg, tokenizer, 4, 2)
  # Different random streams, so statistics agree within sampling error (~3,000 instances).
  assert len(exact) == pytest.approx(len(fast), rel=0.03)
  assert exact.masked.lengths.mean() == pytest.approx(fast.masked.lengths.mean(), rel=0.03)
  assert exact.masked.num_masked.mean() == pytest.approx(fast.masked.num_masked.mean(), rel=0.03)
  assert exact.is_random_next.mean() == pytest.approx(fast.is_random_next.mean(), abs=0.04)
  assert exact.truncated.mean() == pytest.approx(fast.truncated.mean(), abs=0.04)


def test_example_codec_writes_what_protobuf_writes():
  rng = np.random.default_rng(0)
  features = {'input_ids': rng.integers(0, 250_000, (50, 128)),
              'input_mask': rng.integers(0, 2, (50, 128)),
              'masked_lm_positions': rng.integers(0, 512, (50, 80)),
              'masked_lm_weights': rng.random((50, 80)).astype(np.float32),
              'next_sentence_labels': rng.integers(0, 2, (50, 1))}
  features['input_ids'][0, :6] = [0, 127, 128, 16383, 16384, 2 ** 21]
  for ours, row in zip(example_codec.encode_examples(features), range(50)):
    feature = {k: tf.train.Feature(float_list=tf.train.FloatList(value=v[row].tolist()))
               if v.dtype.kind == 'f' else
               tf.train.Feature(int64_list=tf.train.Int64List(value=v[row].tolist()))
               for k, v in features.items()}
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    assert ours == example.SerializeToString(deterministic=True)
  with pytest.raises(ValueError, match='non-negative'):
    example_codec.encode_examples({'x': np.array([[-1]])})


def test_tfrecord_writer_matches_tensorflow_and_is_atomic(tmp_path):
  records = [b'', b'a', bytes(range(256)) * 40]
  ours = tfrecord.TFRecordWriter(str(tmp_path / 'ours'))
  ours.write(records[0])
  ours.write_many(records[1:])
  assert not os.path.exists(tmp_path / 'ours')  # published on close only
  ours.close()
  with tf.io.TFRecordWriter(str(tmp_path / 'tf')) as theirs:
    for r in records:
      theirs.write(r)
  assert (tmp_path / 'ours').read_bytes() == (tmp_path / 'tf').read_bytes()
  aborted = tfrecord.TFRecordWriter(str(tmp_path / 'aborted'))
  aborted.write(b'x')
  aborted.abort()
  assert not list(tmp_path.glob('aborted*'))


# ----------------------------------------------------------------------------- TFRecords


def _job(corpus_file, out, **kw):
  return cpd.Job(output_file=str(out), masking=MaskingConfig(), vocab_file=VOCAB,
                 input_file=corpus_file, dupe_factor=kw.pop('dupe_factor', 2),
                 window_chars=kw.pop('window_chars', 20_000), **kw)


def _raw_records(path):
  return [bytes(r.numpy()) for r in tf.data.TFRecordDataset(path)]


def test_records_have_the_reference_feature_names_and_types(corpus_file, tmp_path):
  stats = cpd.run(_job(corpus_file, tmp_path / 'ours.tfrecord'))
  ours = tf.train.Example.FromString(_raw_records(str(tmp_path / 'ours.tfrecord'))[0])
  ref = tf.train.Example.FromString(_raw_records(REFERENCE_128)[0])
  kinds = lambda ex: {k: (v.WhichOneof('kind'), len(getattr(v, v.WhichOneof('kind')).value))
                      for k, v in ex.features.feature.items()}
  assert kinds(ours) == kinds(ref)
  assert stats['instances'] == stats['rows'] > 100
  assert abs(stats['masked_fraction'] - 0.15) < 0.01
  summary = json.load(open(str(tmp_path / 'ours.tfrecord') + '.stats.json'))
  assert summary['replacement_split']['mask'] == pytest.approx(0.8, abs=0.03)


def test_output_depends_on_seed_and_shards_not_on_workers(corpus_file, tmp_path):
  one = _job(corpus_file, tmp_path / 'a' / 'train', num_shards=2, num_workers=1)
  two = _job(corpus_file, tmp_path / 'b' / 'train', num_shards=2, num_workers=2)
  cpd.run(one)
  cpd.run(two)
  for pa, pb in zip(one.shard_paths(), two.shard_paths()):
    assert _raw_records(pa) == _raw_records(pb)
  other_seed = _job(corpus_file, tmp_path / 'c' / 'train', num_shards=2, random_seed=7)
  cpd.run(other_seed)
  assert _raw_records(other_seed.shard_paths()[0]) != _raw_records(one.shard_paths()[0])


def test_bad_cli_input_is_a_clear_error(corpus_file, tmp_path):
  with pytest.raises(FileNotFoundError, match='vocab file /nope/vocab.txt: no such file'):
    cpd.run(cpd.Job(output_file=str(tmp_path / 'x'), masking=MaskingConfig(),
                    vocab_file='/nope/vocab.txt', input_file=corpus_file))
  with pytest.raises(ValueError, match='--num_workers=3 exceeds --num_shards=2'):
    cpd.run(_job(corpus_file, tmp_path / 'y', num_shards=2, num_workers=3))
  bad = tmp_path / 'bad.txt'
  bad.write_bytes(b'ok\n\xff\n')
  with pytest.raises(ValueError, match='bad.txt, line 2: not UTF-8'):
    cpd.run(_job(str(bad), tmp_path / 'z'))
  assert not os.path.exists(tmp_path / 'z') and not os.path.exists(str(tmp_path / 'z') + '.tmp')


def _parsed_records(path):
  """Each record's features as lists: the reference's protobuf key order differs from ours
  (insertion vs sorted), so records are compared by content, not bytes."""
  out = []
  for raw in _raw_records(path):
    feature = tf.train.Example.FromString(raw).features.feature
    out.append({k: list(getattr(v, v.WhichOneof('kind')).value) for k, v in feature.items()})
  return out


def test_exact_reference_rng_reproduces_the_reference_records(tmp_path):
  """tests/data/reference_docstrings_L64_P10_d2.tfrecord is google-research/bert's own output
  (bert-tensorflow 1.0.4 from PyPI, `python -m bert.create_pretraining_data
  --input_file=reference_docstrings.txt --vocab_file=bert_uncased_vocab.txt
  --do_lower_case=True --max_seq_length=64 --max_predictions_per_seq=10 --dupe_factor=2
  --random_seed=12345`): NSP pairs, masks and labels must come out identical."""
  job = cpd.Job(output_file=str(tmp_path / 'ours'), vocab_file=VOCAB,
                masking=MaskingConfig(64, 10, replace_from_full_vocab=True),
                input_file=os.path.join(DATA, 'reference_docstrings.txt'), dupe_factor=2,
                random_seed=12345, exact_reference_rng=True)
  stats = cpd.run(job)
  want = _parsed_records(os.path.join(DATA, 'reference_docstrings_L64_P10_d2.tfrecord'))
  assert stats['instances'] == len(want) == 212
  assert _parsed_records(job.output_file) == want



def _unpack(batch):
  """Instances of packed rows: (tokens, segment ids, masked positions, labels, NSP label),
  after checking that the packed fields are consistent."""
  out = []
  for r in range(len(batch['input_ids'])):
    seg, pos = batch['packed_segment_ids'][r], batch['position_ids'][r]
    k = int(seg.max())
    w = batch['masked_lm_weights'][r] > 0
    assert (seg[batch['masked_lm_positions'][r][w]] > 0).all()  # predictions inside instances
    assert batch['next_sentence_weights'][r].sum() == k
    assert (batch['input_mask'][r] == (seg > 0)).all()
    for j in range(1, k + 1):
      idx = np.nonzero(seg == j)[0]
      assert (np.diff(idx) == 1).all()  # contiguous
      assert (pos[idx] == np.arange(len(idx))).all()  # positions restart
      assert batch['next_sentence_positions'][r][j - 1] == idx[0]
      assert batch['input_ids'][r][idx[0]] == 101  # [CLS]
      mine = w & (seg[batch['masked_lm_positions'][r]] == j)
      out.append((tuple(batch['input_ids'][r][idx]), tuple(batch['segment_ids'][r][idx]),
                  tuple(batch['masked_lm_positions'][r][mine] - idx[0]),
                  tuple(batch['masked_lm_ids'][r][mine]),
                  int(batch['next_sentence_labels'][r][j - 1])))
  return out


def _rows(batch):
  """The same tuple for unpacked rows."""
  out = []
  for r in range(len(batch['input_ids'])):
    n, w = batch['input_mask'][r].sum(), batch['masked_lm_weights'][r] > 0
    if n:
      out.append((tuple(batch['input_ids'][r][:n]), tuple(batch['segment_ids'][r][:n]),
                  tuple(batch['masked_lm_positions'][r][w]), tuple(batch['masked_lm_ids'][r][w]),
                  int(batch['next_sentence_labels'][r][0])))
  return out


def _read_all(cfg):
  return list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)))


@pytest.mark.parametrize('objective', objectives.OBJECTIVES)
def test_packed_records_hold_exactly_the_instances(corpus_file, tmp_path, objective):
  plain = _job(corpus_file, tmp_path / 'plain', sentence_objective=objective)
  packed = _job(corpus_file, tmp_path / 'packed', pack=True, max_instances_per_row=3,
                sentence_objective=objective)
  cpd.run(plain)
  stats = cpd.run(packed)
  assert stats['rows'] < stats['instances']
  assert stats['padding_fraction'] < stats['padding_fraction_unpacked']
  read = dict(batch_size=16, sentence_objective=objective)
  got = [i for b in _read_all(data_lib.ReaderConfig(files=packed.output_file, packed=True,
                                                    **read)) for i in _unpack(b)]
  want = [i for b in _read_all(data_lib.ReaderConfig(files=plain.output_file, **read))
          for i in _rows(b)]
  assert sorted(got) == sorted(want) and len(got) == stats['instances']


def test_reader_packs_on_the_fly_without_losing_or_changing_instances(corpus_file, tmp_path):
  job = _job(corpus_file, tmp_path / 'plain', max_instances_per_row=1)
  stats = cpd.run(job)
  base = dict(files=job.output_file, batch_size=16)
  want = [i for b in _read_all(data_lib.ReaderConfig(**base)) for i in _rows(b)]
  packed_batches = _read_all(data_lib.ReaderConfig(**base, pack=True, pack_window=256,
                                                   max_instances_per_row=3))
  got = [i for b in packed_batches for i in _unpack(b)]
  assert sorted(got) == sorted(want)
  rows = sum(int(b['input_mask'].any(axis=1).sum()) for b in packed_batches)
  assert rows < 0.8 * stats['instances']
  with pytest.raises(ValueError, match='need unpacked records'):
    data_lib.make_dataset(data_lib.ReaderConfig(**base, packed=True, pack=True), training=True)


@pytest.mark.parametrize('tokenizer_kind', ['wordpiece', 'sentencepiece'])
def test_one_command_from_a_folder_of_text_to_packed_batches(docs, tmp_path, tokenizer_kind):
  import subprocess
  import sys
  folder = tmp_path / 'texts'
  folder.mkdir()
  for i in range(3):
    corpus.write_text_file(docs[i * 100:(i + 1) * 100], str(folder / f'part{i}.txt'))
  out = tmp_path / 'data' / 'train'
  cmd = [sys.executable, '-m', 'input_pipeline.pretrain.create_pretraining_data',
         f'--input_file={folder}/*.txt', f'--output_file={out}',
         f'--train_tokenizer={tokenizer_kind}', '--vocab_size=1500', '--pack',
         '--num_shards=2', '--num_workers=2', '--dupe_factor=2']
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  stats = json.loads(done.stdout[done.stdout.index('{'):])
  vocab = stats['vocab_file'] or stats['spm_model']
  assert os.path.exists(vocab) and stats['packed'] and stats['rows'] < stats['instances']
  cfg = data_lib.ReaderConfig(files=f'{out}-*', batch_size=8, packed=True, seed=1)
  batch = next(data_lib.DataIterator(data_lib.make_dataset(cfg, training=True)))
  assert batch['input_ids'].shape == (8, 128) and batch['next_sentence_weights'].sum() > 8
  assert batch['input_ids'].max() < 1500 + 5


def test_a_learned_wordpiece_vocabulary_is_the_same_file_every_time(docs, tmp_path):
  """HF's trainer alone numbers its `##` alphabet in hash-map order and breaks merge ties by
  those numbers: runs in one process wrote different vocabularies (input_pipeline/tokenizer.py).
  A generator, a list and a callable give the same file, the `##` alphabet sorted after the
  special tokens."""
  sentences = [s for doc in docs[:300] for s in doc]
  made = [WordPieceTokenizer.train(source, 1000, str(tmp_path / str(i)))
          for i, source in enumerate([iter(sentences), sentences, lambda: iter(sentences),
                                      sentences])]
  texts = {open(t.vocab_file, encoding='utf-8').read() for t in made}
  assert len(texts) == 1
  vocab = made[0].vocab
  assert vocab[:5] == ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] and len(vocab) == 1000
  alphabet = [t for t in vocab if t.startswith('##') and len(t) == 3]
  assert vocab[5:5 + len(alphabet)] == sorted(alphabet) and len(set(vocab)) == len(vocab)


# ----------------------------------------------------------------------------- sentence objectives


def _originals(batch):
  """Unpadded rows with their masks undone: (token ids, segment ids, sentence label)."""
  out = []
  for r in range(len(batch['input_ids'])):
    n, w = int(batch['input_mask'][r].sum()), batch['masked_lm_weights'][r] > 0
    if n:
      ids = batch['input_ids'][r].copy()
      ids[batch['masked_lm_positions'][r][w]] = batch['masked_lm_ids'][r][w]
      out.append((ids[:n].tolist(), batch['segment_ids'][r][:n].tolist(),
                  int(batch['next_sentence_labels'][r][0])))
  return out


def _text(ids):
  """Token ids as a string in which contiguity is substring search."""
  return ' ' + ' '.join(map(str, ids)) + ' '


def test_sop_pairs_are_consecutive_segments_swapped_half_the_time(docs, tokenizer, tmp_path):
  # Documents of at most 100 tokens: no chunk needs truncating at 128, so every pair is the
  # exact concatenation of two neighbouring segments.
  short = []
  for doc in docs:
    keep, total = [], 0
    for sentence, ids in zip(doc, tokenizer.encode_batch(doc)):
      if total + len(ids) > 100:
        break
      keep.append(sentence)
      total += len(ids)
    if len(keep) >= 2:
      short.append(keep)
  path = str(tmp_path / 'short.txt')
  corpus.write_text_file(short, path)
  job = _job(path, tmp_path / 'sop', sentence_objective='sop', dupe_factor=3)
  stats = cpd.run(job)
  assert stats['truncation_rate'] == 0 and 'nsp_random_next_fraction' not in stats
  rows = [r for b in _read_all(data_lib.ReaderConfig(files=job.output_file, batch_size=64,
                                                     sentence_objective='sop'))
          for r in _originals(b)]
  documents = [_text(sum(doc, [])) for doc in _tokenized(short, tokenizer)]
  for ids, segment_ids, swapped in rows:
    first_sep = ids.index(tokenizer.sep_id)
    a, b = ids[1:first_sep], ids[first_sep + 1:-1]
    assert segment_ids == [0] * (first_sep + 1) + [1] * (len(b) + 1)
    in_order = _text(b + a if swapped else a + b)
    assert any(in_order in d for d in documents), (a, b, swapped)
  labels = np.array([r[2] for r in rows])
  assert len(labels) == stats['instances'] > 500
  assert abs(labels.mean() - 0.5) < 0.05
  assert stats['sop_swapped_fraction'] == pytest.approx(labels.mean(), abs=1e-4)


def test_sop_cuts_a_one_sentence_chunk_instead_of_borrowing_another_document():
  # Document 0 is one 30-token sentence (ALBERT would pair it with another document), document
  # 1 two one-token sentences.
  window = instances_lib.Window([[list(range(10, 40))], [[7], [8]]])
  cfg = MaskingConfig(max_seq_length=64, short_seq_prob=0)
  pairs = [p for seed in range(200) for doc in range(2)
           for p in instances_lib.sop_spans(window, doc, cfg, random.Random(seed))]
  assert len(pairs) == 400
  for a_start, len_a, b_start, len_b, swapped, truncated in pairs:
    first, second = sorted([(a_start, len_a), (b_start, len_b)])
    assert first[0] + first[1] == second[0]  # one segment right after the other
    assert (a_start < 30) == (b_start < 30)  # of one document
    assert swapped == (a_start > b_start) and not truncated
  cuts = {p[1] for p in pairs if p[0] < 30 and not p[4]}
  assert len(cuts) > 10  # the one sentence is cut anywhere
  assert abs(np.mean([p[4] for p in pairs]) - 0.5) < 0.08


def test_full_sentence_rows_are_full_and_cross_documents_with_a_separator():
  # Token ids that tell their place: 100000 + 1000 * document + 10 * sentence + position.
  rng = random.Random(0)
  docs = [[[100_000 + 1000 * d + 10 * k + j for j in range(rng.randint(1, 9))]
           for k in range(rng.randint(1, 6))] for d in range(60)]
  docs[5][1] = list(range(50_000, 50_070))  # longer than a row: cut
  window = instances_lib.Window(docs)
  orders = [rng.sample(range(60), 60), rng.sample(range(60), 60)]
  built = instances_lib.full_sentence_rows(window, orders, 32, cls_id=1, sep_id=2)
  rows = [r.tolist() for r in built.rows]
  assert all(r[0] == 1 and r[-1] == 2 and len(r) <= 32 for r in rows)
  # The rows hold the documents' tokens in order, nothing dropped, nothing repeated...
  stream = [t for r in rows for t in r[1:-1] if t != 2]
  assert stream == [t for order in orders for d in order for t in sum(docs[d], [])]
  # ... with a [SEP] exactly where one document meets the next inside a row.
  doc_of = lambda t: 5 if t < 100_000 else (t - 100_000) // 1000  # noqa: E731
  for r, n_docs in zip(rows, built.documents):
    inner = r[1:-1]
    assert n_docs == inner.count(2) + 1
    for k in range(1, len(inner)):
      if inner[k] == 2:
        assert doc_of(inner[k - 1]) != doc_of(inner[k + 1])
      elif inner[k - 1] != 2:
        assert doc_of(inner[k - 1]) == doc_of(inner[k])
  assert sum(n > 1 for n in built.documents) > len(rows) / 2
  # Full: the next row's first sentence did not fit in this one.
  for i, (row, nxt) in enumerate(zip(rows, rows[1:])):
    if built.cut[i] or built.cut[i + 1]:
      continue
    first = 1 + next((k for k, t in enumerate(nxt[2:]) if t % 10 == 0 or t == 2), len(nxt) - 2)
    separator = doc_of(nxt[1]) != doc_of(row[-2])
    assert len(row) - 2 + separator + first > 30, (row, nxt)
  assert sum(built.cut) >= 2 and len(rows) - 2 - sum(built.cut) > 20


def test_full_sentence_records_cross_documents_and_report_it(docs, tokenizer, corpus_file,
                                                              tmp_path):
  job = _job(corpus_file, tmp_path / 'full', sentence_objective='none', window_chars=200_000)
  stats = cpd.run(job)
  assert 'nsp_random_next_fraction' not in stats and stats['padding_fraction'] < 0.12
  read = dict(files=job.output_file, batch_size=64, sentence_objective='none')
  rows = [r for b in _read_all(data_lib.ReaderConfig(**read)) for r in _originals(b)]
  documents = [_text(sum(doc, [])) for doc in _tokenized(docs, tokenizer)]
  parts_per_row = []
  for ids, segment_ids, label in rows:
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
    assert set(segment_ids) == {0} and label == 0
    parts, part = [], []
    for t in ids[1:-1] + [tokenizer.sep_id]:
      if t == tokenizer.sep_id:
        parts.append(_text(part))
        part = []
      else:
        part.append(t)
    for k, text in enumerate(parts):  # a document ends before each [SEP], one starts after
      assert any((k == len(parts) - 1 or d.endswith(text)) and (k == 0 or d.startswith(text))
                 and text in d for d in documents)
    parts_per_row.append(len(parts))
  assert len(rows) == stats['rows']
  assert stats['documents_per_row'] == pytest.approx(np.mean(parts_per_row), abs=1e-4)
  assert stats['documents_per_row'] > 1.5
  assert stats['rows_crossing_documents'] == pytest.approx(
      np.mean(np.array(parts_per_row) > 1), abs=1e-4)
  # Dynamic masking keeps the rows' shape: segment ids 0, [CLS]/[SEP] never masked.
  batch = next(data_lib.DataIterator(data_lib.make_dataset(data_lib.ReaderConfig(
      **read, dynamic_masking=True, seed=1), training=True)))
  w = batch['masked_lm_weights'] > 0
  assert (batch['segment_ids'] == 0).all() and w.sum() > 64 * 15
  assert not np.isin(batch['masked_lm_ids'][w], [tokenizer.cls_id, tokenizer.sep_id]).any()


def test_reader_refuses_records_of_another_sentence_objective(corpus_file, tmp_path):
  for have in objectives.OBJECTIVES:
    cpd.run(_job(corpus_file, tmp_path / have, sentence_objective=have, dupe_factor=1,
                 num_shards=2, window_chars=40_000))
    files = str(tmp_path / have) + '-*'
    for want in objectives.OBJECTIVES:
      cfg = data_lib.ReaderConfig(files=files, batch_size=4, sentence_objective=want)
      if want == have:
        next(data_lib.DataIterator(data_lib.make_dataset(cfg, training=True)))
        continue
      with pytest.raises(ValueError, match=(
          rf"data files '.*{have}-\*': 2 of 2 files hold {have} records \(.*\), e\.g\. "
          rf".*{have}-00000-of-00002, but data\.sentence_objective='{want}'; set "
          rf"--config\.data\.sentence_objective={have}, or re-create the files with "
          rf"python -m input_pipeline\.pretrain\.create_pretraining_data --next_sentence={want}")):
        data_lib.make_dataset(cfg, training=False)
  # google-research/bert's records (no marker) count as nsp; ALBERT's (token_boundary) as sop.
  with pytest.raises(ValueError, match='hold nsp records'):
    data_lib.make_dataset(data_lib.ReaderConfig(files=REFERENCE_128, batch_size=4,
                                                sentence_objective='sop'), training=False)
  albert = example_codec.encode_examples({'input_ids': np.ones((1, 4), np.int64),
                                          'token_boundary': np.ones((1, 4), np.int64)})[0]
  assert data_lib.record_objective(albert) == 'sop'
  with pytest.raises(ValueError, match="data.sentence_objective='mlm': expected one of nsp, "):
    data_lib.make_dataset(data_lib.ReaderConfig(files=REFERENCE_128, batch_size=4,
                                                sentence_objective='mlm'), training=False)


def test_objective_flags_that_cannot_work_are_clear_errors(corpus_file, tmp_path):
  with pytest.raises(ValueError, match="--next_sentence='mlm': expected one of nsp, sop, none"):
    cpd.run(_job(corpus_file, tmp_path / 'a', sentence_objective='mlm'))
  with pytest.raises(ValueError, match='--exact_reference_rng .* --next_sentence=sop: drop one'):
    cpd.run(_job(corpus_file, tmp_path / 'b', sentence_objective='sop',
                 exact_reference_rng=True))
  assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- reader


def test_reader_takes_the_reference_records_unchanged():
  cfg = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=8)
  batches = list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)))
  assert len(batches) == 32
  ex = tf.train.Example.FromString(_raw_records(REFERENCE_128)[0]).features.feature
  np.testing.assert_array_equal(batches[0]['input_ids'][0], ex['input_ids'].int64_list.value)
  np.testing.assert_array_equal(batches[0]['masked_lm_weights'][0],
                                ex['masked_lm_weights'].float_list.value)
  assert batches[0]['next_sentence_labels'].shape == (8, 1)


@pytest.mark.parametrize('options', [
    {}, {'dynamic_masking': True, 'whole_word_masking': True, 'vocab_file': VOCAB},
    {'dynamic_masking': True, 'pack': True, 'pack_window': 64}])
def test_restore_mid_epoch_gives_the_same_next_batches(corpus_file, tmp_path, options):
  job = _job(corpus_file, tmp_path / 'train', num_shards=3)
  cpd.run(job)
  cfg = data_lib.ReaderConfig(files=str(tmp_path / 'train-*'), batch_size=8, shuffle_buffer=50,
                              seed=3, **options)
  it = data_lib.DataIterator(data_lib.make_dataset(cfg, training=True))
  for _ in range(7):
    next(it)
  it.save(str(tmp_path / 'it' / 'ckpt'))
  expected = [next(it) for _ in range(5)]
  fresh = data_lib.DataIterator(data_lib.make_dataset(cfg, training=True))
  fresh.restore(str(tmp_path / 'it' / 'ckpt'))
  for want in expected:
    got = next(fresh)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name])
  # And the same seed gives the same stream from the start.
  a = data_lib.DataIterator(data_lib.make_dataset(cfg, training=True))
  b = data_lib.DataIterator(data_lib.make_dataset(cfg, training=True))
  np.testing.assert_array_equal(next(a)['input_ids'], next(b)['input_ids'])


def test_corrupt_or_mismatched_records_name_the_files(tmp_path):
  corrupt = tmp_path / 'corrupt.tfrecord'
  corrupt.write_bytes(open(REFERENCE_128, 'rb').read()[:5000])
  cfg = data_lib.ReaderConfig(files=str(corrupt), batch_size=4)
  with pytest.raises(ValueError, match=r"corrupt.tfrecord: not a valid TFRecord at byte 4\d\d\d "
                                       r".*truncated.*create_pretraining_data"):
    list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False), cfg.files))
  flipped = bytearray(open(REFERENCE_128, 'rb').read())
  flipped[20_000] ^= 1  # one bit inside a record's data: its CRC must catch it
  corrupt.write_bytes(bytes(flipped))
  with pytest.raises(ValueError, match=r"corrupt.tfrecord: not a valid TFRecord at byte"):
    list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False), cfg.files))
  garbage = tmp_path / 'garbage.tfrecord'  # unreadable first record: the objective check
  garbage.write_bytes(b'\x00' * 100)        # leaves it to the reader's error
  cfg = data_lib.ReaderConfig(files=str(garbage), batch_size=4, sentence_objective='sop')
  with pytest.raises(ValueError, match=r'garbage.tfrecord: not a valid TFRecord at byte 0'):
    list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False), cfg.files))
  wrong_length = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=4, max_seq_length=512)
  with pytest.raises(ValueError, match='not BERT TFRecords of this max_seq_length'):
    next(data_lib.DataIterator(data_lib.make_dataset(wrong_length, training=False), REFERENCE_128))


def test_processes_read_disjoint_records():
  def rows(index, count):
    cfg = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=4)
    ds = data_lib.make_dataset(cfg, training=False, process_index=index, process_count=count)
    return {tuple(r) for b in data_lib.DataIterator(ds) for r, m in
            zip(b['input_ids'], b['input_mask']) if m.sum()}
  a, b = rows(0, 2), rows(1, 2)
  assert not a & b and len(a | b) == 256


def test_eval_pads_the_last_batch_with_zero_weight_rows():
  cfg = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=100)
  batches = list(data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)))
  assert [b['input_ids'].shape[0] for b in batches] == [100, 100, 100]
  assert batches[-1]['masked_lm_weights'][56:].sum() == 0


def test_dynamic_masking_draws_fresh_valid_masks():
  cfg = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=64, dynamic_masking=True, seed=5)
  stored = next(data_lib.DataIterator(data_lib.make_dataset(
      data_lib.ReaderConfig(files=REFERENCE_128, batch_size=256), training=False)))
  originals = {}
  for ids, pos, lab, w in zip(stored['input_ids'], stored['masked_lm_positions'],
                              stored['masked_lm_ids'], stored['masked_lm_weights']):
    ids = ids.copy()
    ids[pos[w > 0]] = lab[w > 0]
    originals[tuple(ids[:8])] = ids
  batch = next(data_lib.DataIterator(data_lib.make_dataset(cfg, training=True)))
  masked = changed = 0
  for ids, pos, lab, w, mask in zip(batch['input_ids'], batch['masked_lm_positions'],
                                    batch['masked_lm_ids'], batch['masked_lm_weights'],
                                    batch['input_mask']):
    p = pos[w > 0]
    restored = ids.copy()
    restored[p] = lab[w > 0]
    assert not np.isin(lab[w > 0], [101, 102]).any()
    assert len(p) == min(20, max(1, round(mask.sum() * 0.15)))
    masked += (ids[p] == 103).sum()
    changed += len(p)
  assert 0.7 < masked / changed < 0.9


def test_dynamic_whole_word_masking_masks_whole_words(tokenizer):
  cfg = data_lib.ReaderConfig(files=REFERENCE_128, batch_size=64, dynamic_masking=True, seed=5,
                              whole_word_masking=True, vocab_file=VOCAB)
  batch = next(data_lib.DataIterator(data_lib.make_dataset(cfg, training=True)))
  continuation_pieces = 0
  for ids, pos, lab, w in zip(batch['input_ids'], batch['masked_lm_positions'],
                              batch['masked_lm_ids'], batch['masked_lm_weights']):
    original = ids.copy()
    original[pos[w > 0]] = lab[w > 0]
    masked = set(pos[w > 0].tolist())
    starts = tokenizer.is_word_start(original)
    for p in masked:
      if not starts[p] and original[p - 1] not in (101, 102):
        assert p - 1 in masked
        continuation_pieces += 1
  assert continuation_pieces > 5
  with pytest.raises(ValueError, match='whole_word_masking needs the tokenizer'):
    data_lib.make_dataset(dataclasses.replace(cfg, vocab_file=''), training=True)


def test_data_creation_that_writes_nothing_fails_and_says_what_it_read(tmp_path):
  (tmp_path / 'empty.txt').write_text('')
  (tmp_path / 'blank.txt').write_text('\n\n   \n')
  job = cpd.Job(output_file=str(tmp_path / 'out'), masking=MaskingConfig(64, 10),
                vocab_file=VOCAB, input_file=str(tmp_path / '*.txt'))
  with pytest.raises(ValueError, match=r"wrote nothing, because .*\*.txt \(2 files, 2 empty, "
                                       r"3 lines, 0 skipped lines, 0 documents\) gave no "
                                       r"instance"):
    cpd.run(job)
  assert sorted(os.listdir(tmp_path)) == ['blank.txt', 'empty.txt']  # no empty shards


def test_data_creation_names_an_unwritable_output_before_working(tmp_path):
  (tmp_path / 'a.txt').write_text('One sentence here.\nAnother one.\n')
  job = cpd.Job(output_file='/proc/nope/out', masking=MaskingConfig(64, 10), vocab_file=VOCAB,
                input_file=str(tmp_path / 'a.txt'))
  with pytest.raises(OSError, match='/proc/nope: cannot create the directory: .*choose a '
                                    'location you can write to'):
    cpd.run(job)
