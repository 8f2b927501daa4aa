"""gs:// end to end against a real GCS server on localhost (fake-gcs-server, started here).

Nothing of ours is mocked: the commands a user runs on a pod (data creation, training, kill -9,
resume, export) run as subprocesses on gs:// paths, and find the server the way every Google
client library does, through STORAGE_EMULATOR_HOST. gcsfs serves our file-system layer and
Orbax's paths, TensorStore writes Orbax's arrays; on a pod the same code talks to GCS itself.
A pod's processes sharing a gs:// workdir: tests/test_pod.py (its uninterrupted run).
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gcs_server
from cpu_env import cpu_env
from input_pipeline import fs, tfrecord
from input_pipeline.pretrain import corpus
from test_train import logged_losses


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'gs://bert-jax-test'
VOCAB = os.path.join(ROOT, 'tests', 'data', 'bert_uncased_vocab.txt')


@pytest.fixture(scope='module')
def gcs():
  with gcs_server.running() as url:
    gcsfs_fs, _ = fs._filesystem(BUCKET)  # pylint: disable=protected-access
    gcsfs_fs.mkdir(BUCKET[len('gs://'):])
    yield url


def run(args, timeout=300):
  env = cpu_env()
  out = subprocess.run([sys.executable, '-m', *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def train_args(workdir, data, steps=12):
  values = {
      'model.vocab_size': 1000, 'data.train_files': f'{data}/train-*',
      'data.eval_files': f'{data}/eval', 'data.vocab_file': f'{data}/train.vocab/vocab.txt',
      'data.max_seq_length': 64, 'data.max_predictions_per_seq': 10, 'data.shuffle_buffer': 100,
      'train.num_steps': steps, 'train.global_batch_size': 8, 'train.log_every': 1,
      'train.eval_every': 1000, 'train.eval_steps': 2, 'train.checkpoint_every': 4,
      'optimizer.learning_rate': 1e-3, 'optimizer.warmup_steps': 2,
  }
  return (['bert_jax.main', '--config=configs/bert_tiny.py', f'--workdir={workdir}'] +
          [f'--config.{k}={v}' for k, v in values.items()])


def test_data_train_kill_resume_export_all_on_gs(gcs, tmp_path):
  data = f'{BUCKET}/data'
  docs = list(corpus.embedded_documents())[:300]
  corpus.write_text_file(docs[:270], f'{BUCKET}/text/train.txt')
  corpus.write_text_file(docs[270:], f'{BUCKET}/text/eval.txt')
  common = ['--max_seq_length=64', '--max_predictions_per_seq=10', '--dupe_factor=1']
  run(['input_pipeline.pretrain.create_pretraining_data', f'--input_file={BUCKET}/text/train.txt',
       f'--output_file={data}/train', '--train_tokenizer=wordpiece', '--vocab_size=1000',
       '--num_shards=2', '--num_workers=2', '--window_chars=20000', *common])
  # The held-out records with the vocabulary just trained on the bucket: the same code in this
  # process (a second CLI would only repeat the first's ~5 s of imports).
  from input_pipeline.pretrain import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from input_pipeline.pretrain.instances import MaskingConfig  # pylint: disable=g-import-not-at-top
  cpd.run(cpd.Job(output_file=f'{data}/eval', masking=MaskingConfig(64, 10),
                  vocab_file=f'{data}/train.vocab/vocab.txt',
                  input_file=f'{BUCKET}/text/eval.txt', dupe_factor=1))
  assert fs.exists(f'{data}/eval')
  stats = json.loads(fs.read_text(f'{data}/train.stats.json'))
  assert stats['instances'] > 100 and stats['files'] == [f'{data}/train-00000-of-00002',
                                                          f'{data}/train-00001-of-00002']

  whole, killed = f'{BUCKET}/whole', f'{BUCKET}/killed'
  run(train_args(whole, data))
  env = cpu_env()
  proc = subprocess.Popen([sys.executable, '-m', *train_args(killed, data)], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while not (fs.exists(f'{killed}/metrics.jsonl') and max(logged_losses(killed)) >= 6):
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.time() < deadline, 'step 6 not reached'
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = [int(s) for s in fs.listdir(f'{killed}/checkpoints') if s.isdigit()]
  assert steps and max(steps) < 12, steps  # it really died mid-run, after a checkpoint
  run(train_args(killed, data))
  a, b = logged_losses(whole), logged_losses(killed)
  assert sorted(a) == sorted(b) == list(range(1, 13))
  assert [a[s] for s in a] == [b[s] for s in a]  # bit for bit, resumed mid-run from gs://

  # Every output of the run is on the bucket, none on local disk.
  for name in ('config.json', 'metrics.jsonl', 'checkpoints/12/_CHECKPOINT_METADATA',
               'checkpoints/12/data/process_0/it.index'):
    assert fs.exists(f'{killed}/{name}'), name
  assert not os.path.exists(os.path.join(ROOT, 'gs:'))
  events = fs.glob(f'{killed}/tensorboard/events.out.tfevents.*')
  assert len(events) == 2  # one per session: the killed one and the resumed one
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  tags = {v.tag for e in events for r in tfrecord.read_all(e)[1:]
          for v in event_pb2.Event.FromString(r).summary.value}
  assert {'train/loss', 'train/mlm_accuracy'} <= tags

  export = f'{BUCKET}/export'
  run(['bert_jax.export', f'--workdir={killed}', f'--output={export}'])
  assert set(fs.listdir(export)) >= {'config.json', 'model.safetensors', 'vocab.txt'}
  import transformers  # pylint: disable=g-import-not-at-top
  fs.download_dir(export, str(tmp_path / 'export'))
  model, info = transformers.BertForPreTraining.from_pretrained(
      str(tmp_path / 'export'), output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys']
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'export'))
  assert tok('the list')['input_ids'][0] == tok.cls_token_id


def test_fs_layer_on_gs(gcs):
  path = f'{BUCKET}/fs/a.bin'
  fs.write_bytes(path, b'0123456789')
  assert fs.read_bytes(path) == b'0123456789' and fs.size(path) == 10
  assert fs.read_range(path, 3, 6) == b'345'
  assert fs.glob(f'{BUCKET}/fs/*.bin') == [path]
  with pytest.raises(RuntimeError):
    with fs.writer(f'{BUCKET}/fs/half.bin') as f:
      f.write(b'x' * 1000)
      raise RuntimeError('killed half-way')
  assert not fs.exists(f'{BUCKET}/fs/half.bin')  # nothing half-written is published
  with pytest.raises(FileNotFoundError, match='gs://no-such-bucket/x: cannot read: no such '
                                              'file, directory or bucket; check the bucket'):
    fs.read_bytes('gs://no-such-bucket/x')


def test_reader_chunks_on_gs_match_local(gcs, tmp_path):
  """The reader's byte-range chunks read the same records from gs:// as locally."""
  records = [np.random.default_rng(i).bytes(int(n)) for i, n in
             enumerate(np.random.default_rng(0).integers(1, 3000, 200))]
  local, remote = str(tmp_path / 'r.tfrecord'), f'{BUCKET}/chunks/r.tfrecord'
  for path in (local, remote):
    w = tfrecord.TFRecordWriter(path)
    w.write_many(records)
    w.close()
  size = fs.size(remote)
  for chunk in (1024, 4096, size):
    got = [r for start in range(0, size, chunk)
           for r in tfrecord.records_in_range(remote, start, min(start + chunk, size), size)]
    assert got == records
  assert tfrecord.read_all(local) == records


def test_data_creation_names_a_missing_bucket(gcs, tmp_path):
  from input_pipeline.pretrain import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from input_pipeline.pretrain.instances import MaskingConfig  # pylint: disable=g-import-not-at-top
  (tmp_path / 'a.txt').write_text('One sentence here.\nAnother one.\n')
  job = cpd.Job(output_file='gs://no-such-bucket/out', masking=MaskingConfig(64, 10),
                vocab_file=VOCAB,
                input_file=str(tmp_path / 'a.txt'))
  with pytest.raises(OSError, match='gs://no-such-bucket.*cannot write.*check the bucket name'):
    cpd.run(job)
