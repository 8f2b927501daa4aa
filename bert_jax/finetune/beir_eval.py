r"""Score an embedding model on a BEIR-format set of any size.

  python -m bert_jax.finetune.beir_eval --config=configs/finetune.py:embedding --init=runs/emb \
      --beir_dir=scifact --split=test [--output=scifact_test.json] [--bm25] \
      [--config.data.query_prompt='query: ' --config.data.document_prompt='passage: ']

The set is read by input_pipeline/finetune/beir.py (graded qrels); queries and corpus are
embedded a block at a time through the run's own predict step, each batch sharded over the
devices (bert_jax/finetune/embed.py); every query's top 10 is found by the chunked exact search
(bert_jax/finetune/search.py), so memory is the corpus embeddings plus fixed-size blocks, never
the query x corpus matrix. Scores are BEIR's recall@1/10, MRR@10 and nDCG@10 as pytrec_eval
computes them with graded relevance (bert_jax/finetune/retrieval.py). As BEIR's
`EvaluateRetrieval.evaluate` (`ignore_identical_ids=True`), a document whose id is the query's
own is not counted as retrieved (ArguAna, Quora), so the search asks for one more.
"""

if __name__ == '__main__':  # before the heavy imports, as the other CLIs
  from bert_jax.training import host_malloc
  host_malloc.reexec_with_tuned_malloc()

import json
import time

import numpy as np
from absl import app, flags


def drop_identical(ids: np.ndarray, query_ids, doc_ids, k: int) -> np.ndarray:
  """[Q, k] rankings without the document named as its query (BEIR's ignore_identical_ids),
  -1 padded where too few remain."""
  out = np.full((len(ids), k), -1, np.int64)
  for q, row in enumerate(ids):
    kept = [d for d in row if d >= 0 and doc_ids[d] != query_ids[q]][:k]
    out[q, :len(kept)] = kept
  return out


def evaluate(embedder, split, *, ignore_identical_ids: bool = True) -> dict:
  """BEIR's metrics of `embedder` (embed.Embedder) on a read set (beir.read_beir)."""
  from bert_jax.finetune import retrieval, search  # pylint: disable=g-import-not-at-top
  k = retrieval.RANK_DEPTH
  queries = embedder.embed(split.queries, 'query')
  corpus = embedder.embed(split.corpus, 'document')
  _, ids = search.top_k(queries, corpus, k + ignore_identical_ids)
  ids = (drop_identical(ids, split.query_ids, split.doc_ids, k) if ignore_identical_ids
         else ids[:, :k])
  return retrieval.retrieval_metrics(ranking=ids, relevant=split.relevant)


def bm25(split, *, ignore_identical_ids: bool = True) -> dict:
  """The lexical baseline's metrics on the same set (one query's scores at a time)."""
  from bert_jax.finetune import retrieval  # pylint: disable=g-import-not-at-top
  k = retrieval.RANK_DEPTH
  _, ids = retrieval.lexical_top_k(split.queries, split.corpus, k + ignore_identical_ids)
  ids = (drop_identical(ids, split.query_ids, split.doc_ids, k) if ignore_identical_ids
         else ids[:, :k])
  return retrieval.retrieval_metrics(ranking=ids, relevant=split.relevant)


FLAGS = flags.FLAGS


def main(argv):
  from bert_jax.finetune import embed  # pylint: disable=g-import-not-at-top
  from bert_jax.training import run_control  # pylint: disable=g-import-not-at-top
  from input_pipeline import fs  # pylint: disable=g-import-not-at-top
  from input_pipeline.finetune import beir  # pylint: disable=g-import-not-at-top
  config = run_control.finetune_config(argv, FLAGS)
  with run_control.user_errors():
    split = beir.read_beir(FLAGS.beir_dir, FLAGS.split)
    start = time.perf_counter()
    out = {'model': evaluate(embed.Embedder(config), split,
                             ignore_identical_ids=FLAGS.ignore_identical_ids)}
    out['seconds'] = time.perf_counter() - start
    if FLAGS.bm25:
      out['bm25'] = bm25(split, ignore_identical_ids=FLAGS.ignore_identical_ids)
  out.update(beir_dir=FLAGS.beir_dir, split=FLAGS.split, queries=len(split.queries),
             corpus=len(split.corpus), init=config.init)
  text = json.dumps(out, indent=2)
  if FLAGS.output:
    fs.write_text(FLAGS.output, text + '\n')
  print(text)


def define_flags():
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'configs/finetune.py:embedding (its '
                                  'data.pooling, prompts and max_seq_length embed the texts)')
  flags.DEFINE_string('init', None, 'The model: our workdir, a sentence-transformers or HF '
                      'directory (sets config.init).')
  flags.DEFINE_string('beir_dir', None, 'corpus.jsonl, queries.jsonl and qrels/<split>.tsv.')
  flags.DEFINE_string('split', 'test', 'The qrels file: qrels/<split>.tsv.')
  flags.DEFINE_string('output', None, 'Also write the scores here (JSON).')
  flags.DEFINE_bool('bm25', False, 'Score BM25 on the same set too.')
  flags.DEFINE_bool('ignore_identical_ids', True, 'Never count a query\'s own id as retrieved '
                    '(BEIR\'s default).')
  flags.mark_flags_as_required(['config', 'beir_dir'])


if __name__ == '__main__':
  define_flags()
  app.run(main)
