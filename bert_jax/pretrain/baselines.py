"""What a held-out pre-training score should be compared with: the majority baselines of a
run's eval records (the demo and the benchmarks print them next to the model's accuracies)."""

from __future__ import annotations

import collections

from input_pipeline.pretrain import dataset as data_lib


def eval_baselines(config) -> dict[str, float]:
  """Majority accuracies of `config.data.eval_files`, read as the run reads them: {'mlm': the
  most frequent masked token's share, 'sentence': the more frequent sentence label's share of
  the real instances (not 0.5: short documents make most NSP pairs random-next)}."""
  tokens: collections.Counter = collections.Counter()
  labels: collections.Counter = collections.Counter()
  cfg = data_lib.reader_config(config, config.data.eval_files, batch_size=256)
  for batch in data_lib.DataIterator(data_lib.make_dataset(cfg, training=False)):
    ids, w = batch['masked_lm_ids'], batch['masked_lm_weights']
    tokens.update(ids[w > 0].tolist())
    nsp = batch['next_sentence_labels']
    real = (batch['next_sentence_weights'] > 0 if 'next_sentence_weights' in batch
            else (batch['input_mask'][:, 0] > 0).reshape(nsp.shape))
    labels.update(nsp[real].tolist())
  out = {'mlm': tokens.most_common(1)[0][1] / sum(tokens.values())}
  if labels:
    out['sentence'] = labels.most_common(1)[0][1] / sum(labels.values())
  return out
