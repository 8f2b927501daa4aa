"""A training workdir exported to a HuggingFace directory of its family
(`BertForPreTraining`, `(XLM)RobertaForMaskedLM`, `ElectraForMaskedLM`, `ModernBertForMaskedLM`)
with its tokenizer, whatever mesh or optimizer wrote it (`python -m bert_jax.export` is its
command line). A replaced-token detection run (`train.objective=rtd`) exports the pair as
google/electra-* releases them: `OUTPUT/discriminator` (`ElectraForPreTraining`) and
`OUTPUT/generator` (`ElectraForMaskedLM`), each with the tokenizer.

An export always carries a tokenizer: the one the run's data names, else (continued
pre-training that named none) the start point's; a run with neither is refused before anything
is written, saying what to pass. Without one, transformers' `pipeline('fill-mask', model=...)`
fails inside its tokenizer loading with a message about sentencepiece or tiktoken.
"""

from __future__ import annotations

from bert_jax.convert import hf, hf_electra, start_points
from bert_jax.model import rtd as rtd_model
from bert_jax.pretrain.rtd import rtd_config
from bert_jax.convert.workdir import load_run_config, run_tokenizer
from bert_jax.training import checkpointing
from bert_jax.training.run_setup import model_config
from input_pipeline import fs


def export_tokenizer(config, workdir: str):
  """The tokenizer an export of this run carries: its data's, else its start point's."""
  tokenizer = run_tokenizer(config)
  if tokenizer is not None:
    return tokenizer
  init_from = config.train.get('init_from') if 'train' in config else None
  if init_from:
    tokenizer = start_points.load_start_point(init_from, require_tokenizer=False).tokenizer
    if tokenizer is not None:
      return tokenizer
  start = f' and its start point {init_from} has none' if init_from else ''
  raise ValueError(
      f'{workdir}: no tokenizer to export with: the run names no data.vocab_file, '
      f'data.spm_model or data.tokenizer{start}; pass the one the data was made with, e.g. '
      '--config.data.tokenizer=DIR_OR_FILE (or data.vocab_file / data.spm_model), so '
      'transformers can load the export')


def export_workdir(workdir: str, output: str, step: int | None = None, config=None,
                   overwrite: bool = True) -> str:
  """Writes the workdir's latest (or `step`) params as an HF directory; returns `output`."""
  config = config if config is not None else load_run_config(workdir)
  step, params = checkpointing.restore_params(workdir, step)
  cfg = model_config(config).replace(scan_layers=config.model.scan_layers)
  tokenizer = export_tokenizer(config, workdir)  # before anything is written
  if config.train.objective == 'rtd':
    return export_rtd_pair(output, rtd_config(config, cfg), params, tokenizer, overwrite)
  return hf.save_pretrained(output, cfg, params, tokenizer=tokenizer, overwrite=overwrite)


def export_rtd_pair(output: str, cfg: rtd_model.RtdConfig, params, tokenizer=None,
                    overwrite: bool = True) -> str:
  """A replaced-token detection tree as `output/discriminator` (ElectraForPreTraining) and
  `output/generator` (ElectraForMaskedLM), each network's whole tree (`rtd.half_params`: the
  shared embeddings in both, GDES's stop_gradient(shared) + residual summed)."""
  for half, net_cfg, architecture in (
      (rtd_model.DISCRIMINATOR, cfg.discriminator, hf_electra.architecture('ForPreTraining')),
      (rtd_model.GENERATOR, cfg.generator, hf_electra.architecture('ForMaskedLM'))):
    hf.save_pretrained(fs.join(output, half), net_cfg,
                       rtd_model.half_params(params, half, cfg.sharing), tokenizer=tokenizer,
                       overwrite=overwrite, architecture=architecture)
  return output
