"""HuggingFace PyTorch BERT with random, non-trivial weights: the reference for parity tests."""

import jax
import numpy as np
import torch
import transformers

from bert_jax.convert import hf
from bert_jax.model.encoder import BertConfig


def torch_model(cfg: BertConfig, seed: int = 0) -> transformers.BertForPreTraining:
  """BertForPreTraining in eval mode, every weight random (LayerNorms and biases included)."""
  torch.manual_seed(seed)
  hf_cfg = transformers.BertConfig(**{k: v for k, v in hf.config_to_hf(cfg).items()
                                      if k not in ('architectures', 'model_type')})
  return randomize(transformers.BertForPreTraining(hf_cfg).eval())


def randomize(model):
  """Every weight of an HF model random, LayerNorm scales near 1 (under the current seed)."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if 'LayerNorm.weight' in name or name.endswith('norm.weight'):  # BERT's, ModernBERT's
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.copy_(0.05 * torch.randn_like(p))
  return model


def random_params(init, *args, seed: int = 0) -> dict:
  """Random float32 weights shaped as `init(*args, key)` returns them (LayerNorm scales near 1,
  everything else ~N(0, 0.05)), drawn by numpy from the abstract tree: nothing is compiled,
  where each jitted initialiser costs ~5 s of XLA per config here. For tests that compare a
  model's outputs, not its initialiser."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    base = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
    return (base + 0.05 * rng.normal(size=leaf.shape)).astype(np.float32)

  abstract = jax.eval_shape(lambda: init(*args, jax.random.key(0)))
  return jax.tree_util.tree_map_with_path(draw, abstract)


def state_dict(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def torch_outputs(model, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """HF's outputs in our naming; MLM logits gathered at masked_lm_positions."""
  t = {k: torch.from_numpy(np.asarray(v)).long() for k, v in batch.items()
       if k in ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions')}
  with torch.no_grad():
    base = model.bert(input_ids=t['input_ids'], attention_mask=t['input_mask'],
                      token_type_ids=t['segment_ids'])
    seq, pooled = base.last_hidden_state, base.pooler_output
    idx = t['masked_lm_positions'][:, :, None].expand(-1, -1, seq.shape[-1])
    mlm = model.cls.predictions(torch.gather(seq, 1, idx))
    nsp = model.cls.seq_relationship(pooled)
  return dict(sequence_output=seq.numpy(), pooled_output=pooled.numpy(),
              mlm_logits=mlm.numpy(), nsp_logits=nsp.numpy())


def random_batch(cfg: BertConfig, batch: int = 3, length: int = 24, predictions: int = 5,
                 seed: int = 0) -> dict[str, np.ndarray]:
  """Rows with a different amount of end padding each, two segments, masked positions."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, cfg.vocab_size, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  seg = np.zeros((batch, length), np.int32)
  for b in range(batch):
    real = length - 3 * b
    mask[b, real:] = 0
    ids[b, real:] = 0
    seg[b, real // 2:real] = 1
  positions = np.stack([np.sort(rng.choice(length - 3 * (batch - 1), predictions, replace=False))
                        for _ in range(batch)]).astype(np.int32)
  return dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_lm_positions=positions)
