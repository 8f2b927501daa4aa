"""Old config.json files read as new ones: `upgrade_config` fills the fields an earlier
version did not write with today's defaults (configs/common.py, configs/finetune.py), so the
code reads every config's fields plainly and the defaults live in one place."""

from absl import logging
import ml_collections

from configs import common, finetune


def upgrade_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills the fields a config.json of an earlier version lacks with today's defaults for its
  kind (fine-tuning if it has `task`, else pre-training), in place; values present are kept.
  Every config read back from JSON goes through here once, so the code reads any config's
  fields as it reads a new one's, and the defaults live only in this file."""
  current = finetune.get_config(config.task) if 'task' in config else common.base_config()
  filled = _fill_missing(config, current, '')
  if filled:
    logging.info('config from before %s: today\'s defaults filled in', ', '.join(filled))
  return config


def _fill_missing(config, current, prefix: str) -> list[str]:
  """Copies `current`'s fields missing from `config` into it, recursing into blocks both
  have; returns the dotted names filled."""
  filled = []
  for key, value in current.items():
    if key not in config:
      config[key] = value
      filled.append(prefix + key)
    elif isinstance(value, ml_collections.ConfigDict) and isinstance(
        config[key], ml_collections.ConfigDict):
      filled += _fill_missing(config[key], value, f'{prefix}{key}.')
  return filled
