"""An export's masked-LM head through transformers, as a PyTorch user loads it: the check the
demo and the benchmarks print (`fill_mask_example`)."""

from __future__ import annotations


# What a BertForPreTraining export holds that BertForMaskedLM has no place for.
PRETRAINING_ONLY = ('bert.pooler.', 'cls.seq_relationship.')


def masked_lm_model(export_dir: str):
  """(BertForMaskedLM, the checkpoint keys it left out) of an export. The export is
  BertForPreTraining; its pooler and NSP head are not part of a masked-LM model, which
  transformers would list as UNEXPECTED in a load report. The report is silenced and the
  load checked here instead: anything else left out, missing or reshaped is an error."""
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.utils import logging as hf_logging  # pylint: disable=g-import-not-at-top
  verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
  hf_logging.set_verbosity_error()
  hf_logging.disable_progress_bar()
  try:
    model, info = transformers.BertForMaskedLM.from_pretrained(export_dir,
                                                               output_loading_info=True)
  finally:
    hf_logging.set_verbosity(verbosity)
    if bar:
      hf_logging.enable_progress_bar()
  left_out = sorted(info['unexpected_keys'])
  wrong = {'missing': sorted(info['missing_keys']),
           'mismatched': sorted(k[0] for k in info['mismatched_keys']),
           'unexpected': [k for k in left_out if not k.startswith(PRETRAINING_ONLY)]}
  if any(wrong.values()):
    raise ValueError(f'{export_dir}: not a BertForPreTraining export as bert_jax.export writes '
                     f'it ({ {k: v for k, v in wrong.items() if v} }); export it again with '
                     'python -m bert_jax.export')
  return model, left_out


def fill_mask_example(export_dir: str) -> tuple[str, list[tuple[str, float]]]:
  """The export's top 5 for one masked docstring sentence, through transformers' pipeline."""
  import transformers  # pylint: disable=g-import-not-at-top
  model, _ = masked_lm_model(export_dir)
  fill = transformers.pipeline('fill-mask', model=model,
                               tokenizer=transformers.AutoTokenizer.from_pretrained(export_dir),
                               device='cpu')
  text = 'Return a new [MASK] containing the items of the iterable.'
  return text, [(r['token_str'], round(r['score'], 3)) for r in fill(text, top_k=5)]
