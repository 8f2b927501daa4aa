"""Sentence objectives beside MLM: the reference's NSP, ALBERT's SOP, RoBERTa's none.

`nsp` (default) is google-research/bert's next-sentence prediction (`instances.pair_spans`).

`sop` is ALBERT's sentence-order prediction (Lan et al. 2019, sec 3.1; `instances.sop_spans`):
A and B are two consecutive segments of one document, cut as the reference cuts an NSP pair
(target length, `short_seq_prob`, A = a random number of the chunk's sentences, B = the rest),
then swapped with probability 0.5. The label follows google-research/albert's
create_pretraining_data.py: `next_sentence_labels` = 1 when swapped, 0 in order (ALBERT keeps
BERT's feature name too, so the 2-way head and its loss serve unchanged). One deliberate
difference: for a one-sentence chunk ALBERT falls back to BERT's random next sentence from
another document, labelled 1, which mixes a topic cue into the order label and tilts the
balance off 50%; here that sentence is cut at a random token into A and B instead (a one-token
chunk yields no pair), so every pair is consecutive and the label is about order only.

`none` is RoBERTa's FULL-SENTENCES (Liu et al. 2019, sec 4.2; fairseq's
`--sample-break-mode complete`; `instances.full_sentence_rows`): each row is
`[CLS] sentences... [SEP]`, filled with whole contiguous sentences while they fit and
continuing into the next document, with a [SEP] between documents; segment ids are all 0 and
there is no sentence label (labels are written as 0 and the trainer trains MLM only).
`short_seq_prob` does not apply (RoBERTa trains on full rows). A sentence longer than a row
would be cut anyway, so it fills the current row's room and then whole rows (those rows count
as truncated). Each dupe pass reshuffles the window's documents, so passes differ in where
rows start and which documents meet, not only in their masks.

Packing (`--pack`, `data.pack`) and dynamic masking work on all three unchanged: SOP rows are
pairs like NSP's, and a full-sentence row is one instance with all-zero segment ids (dynamic
masking rebuilds exactly that, and never masks the separators). Packing full-sentence rows
gains little, since only a window's last row is short, but it is allowed rather than refused
so that one reader config serves every objective.

Records say which objective wrote them with an int64 feature `sentence_objective` (1 = sop,
2 = none) in every record. nsp records carry none, so they stay exactly the reference's
records, and records without one count as nsp (google-research/bert's), or as sop when they
have ALBERT's `token_boundary` feature. A per-record feature rather than a sidecar file
because it travels with the data: shards get copied, re-globbed and mixed without their stats
JSON, and `tf.io.parse_example` ignores features it is not asked for, so the reference's
reader still reads our files. The reader (`dataset.check_sentence_objective`) refuses a
mismatch with `data.sentence_objective`. The stats JSON reports each objective's balance:
`nsp_random_next_fraction`, `sop_swapped_fraction`, or `documents_per_row` and
`rows_crossing_documents`.
"""

from __future__ import annotations

import numpy as np

OBJECTIVES = ('nsp', 'sop', 'none')
MARKER = 'sentence_objective'
_CODES = {'nsp': 0, 'sop': 1, 'none': 2}
DESCRIPTIONS = {'nsp': 'next-sentence labels (BERT)', 'sop': 'sentence-order labels (ALBERT)',
                'none': 'full-sentence rows without a sentence label (RoBERTa)'}


def check_name(objective: str, field: str) -> str:
  """The objective, or a ValueError naming the field that holds a bad one."""
  if objective not in OBJECTIVES:
    raise ValueError(f'{field}={objective!r}: expected one of {", ".join(OBJECTIVES)} '
                     '(what create_pretraining_data --next_sentence wrote)')
  return objective


def name_of_code(code: int) -> str:
  for name, value in _CODES.items():
    if value == code:
      return name
  raise ValueError(f'feature {MARKER}={code}: unknown objective code; expected one of '
                   f'{sorted(_CODES.values())} (re-create the files)')


def marker_features(objective: str, rows: int) -> dict[str, np.ndarray]:
  """The marker feature for `rows` records; none for nsp (the reference's exact records)."""
  if objective == 'nsp':
    return {}
  return {MARKER: np.full((rows, 1), _CODES[objective], np.int32)}


def summary(stats, objective: str) -> dict:
  """The objective's balance for the stats JSON, from merged `InstanceStats`."""
  n = max(stats.instances, 1)
  if objective == 'nsp':
    return {'nsp_random_next_fraction': round(stats.random_next / n, 4)}
  if objective == 'sop':
    return {'sop_swapped_fraction': round(stats.random_next / n, 4)}
  return {'documents_per_row': round(stats.documents / n, 4),
          'rows_crossing_documents': round(stats.crossing_rows / n, 4)}
