"""The eval reader's padding rows must not count in the sentence head's metrics."""

import types

import jax.numpy as jnp
import numpy as np

from bert_jax.pretrain import step as ts


def test_padding_rows_of_the_last_eval_batch_carry_no_sentence_weight():
  # 3 real rows (labels 1, 1, 0) and 2 padding rows as dataset._pad_to_batch makes them.
  mask = np.zeros((5, 8), np.int32)
  mask[:3, :6] = 1
  batch = {'input_mask': jnp.asarray(mask),
           'next_sentence_labels': jnp.asarray([[1], [1], [0], [0], [0]]),
           'masked_lm_ids': jnp.zeros((5, 2), jnp.int32),
           'masked_lm_weights': jnp.asarray([[1.0, 1.0]] * 3 + [[0.0, 0.0]] * 2)}
  logits = jnp.asarray([[0.0, 5.0]] * 5)  # always "label 1": right on 2 of the 3 real rows
  out = types.SimpleNamespace(nsp_logits=logits, mlm_logits=jnp.zeros((5, 2, 4)))
  sums = ts.loss_sums(out, batch, 'nsp')
  assert float(sums['nsp_weight']) == 3.0
  np.testing.assert_allclose(float(ts.summarize(sums)['nsp_accuracy']), 2 / 3, rtol=1e-4)
