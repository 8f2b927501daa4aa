"""MR movie-review snippets (Pang & Lee 2005) with VADER's human ratings, from PyPI.

The PyPI source distribution `vaderSentiment==3.3.2` ships Hutto & Gilbert's ICWSM-2014 data:
`vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz`, whose
`hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt` holds the 10,605 sentences of Pang &
Lee's movie-review snippets, one per line: `id<TAB>mean human rating in [-4, 4]<TAB>sentence`.
`fetch_mr` downloads the sdist with pip (an ordinary client of an index every user can reach,
checked against a pinned SHA-256); `read_mr` reads the ratings from the sdist, the inner
archive or the extracted file.

Labels: a sentence with rating >= 0.5 is positive ('1'), <= -0.5 negative ('0'), as SST-2
numbers them; the 533 sentences rated within (-0.5, 0.5) are neutral and left out. That gives
4,996 positive and 5,076 negative, 10,072 labelled sentences. `task='regression'` keeps the
same sentences with the raw rating as a float target.

Split (`mr_splits`): the labelled sentences in file order, shuffled by
`random.Random(seed).shuffle`, then the first `n * 8 // 10` are train, the next `n // 10` dev
and the rest test (8,057 / 1,007 / 1,008 for n = 10,072). `random.Random`'s shuffle is
the same on every platform and Python 3 version, so a seed names one split.

Encoding: the file is UTF-8 (133 lines have non-ASCII characters: é, –, ’, ...) with CRLF line
ends and no newline after the last line; it is decoded strictly as UTF-8, a line that is not is
an error naming the line, and line ends are stripped. Texts are kept as written (the snippets
write double quotes as two apostrophes, `''Conan''`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile

from input_pipeline.finetune.records import data_error, Example, require_examples

SDIST = 'vaderSentiment-3.3.2.tar.gz'
SDIST_SHA256 = '5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9'
INNER_ARCHIVE = 'vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz'
RATINGS_FILE = 'hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt'
LABELS = ('0', '1')  # negative, positive (as SST-2)
THRESHOLD = 0.5


@dataclasses.dataclass(frozen=True)
class Snippet:
  id: int
  rating: float  # mean human rating in [-4, 4]
  text: str


def fetch_mr(cache_dir: str) -> str:
  """The path of the vaderSentiment 3.3.2 sdist in `cache_dir`, downloaded with pip if absent.

  Runs `python -m pip download --no-deps --no-binary :all: vaderSentiment==3.3.2`, then checks
  the file's SHA-256, so a cache entry is the exact file the counts above were verified on.
  """
  path = os.path.join(cache_dir, SDIST)
  if not os.path.exists(path):
    os.makedirs(cache_dir, exist_ok=True)
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
           '--disable-pip-version-check', 'vaderSentiment==3.3.2', '-d', cache_dir]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not os.path.exists(path):
      raise RuntimeError(f'could not download {SDIST} ({" ".join(cmd)} exited with '
                         f'{done.returncode}): {done.stderr.strip()[-1000:]}\nDownload it by '
                         f'hand into {cache_dir} and run again.')
  _check_sha256(path)
  return path


def _check_sha256(path: str) -> None:
  with open(path, 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != SDIST_SHA256:
    raise ValueError(f'{path}: SHA-256 {digest} is not that of PyPI\'s {SDIST} '
                     f'({SDIST_SHA256}); delete it and fetch again')


def read_mr(path: str) -> list[Snippet]:
  """All 10,605 rated snippets, from the sdist, `hutto_ICWSM_2014.tar.gz` or the .txt file."""
  if path.endswith('.txt'):
    with open(path, 'rb') as f:
      return parse_ratings(f.read(), path)
  if not path.endswith(('.tar.gz', '.tgz')):
    raise ValueError(f'{path}: expected {SDIST}, hutto_ICWSM_2014.tar.gz or '
                     'movieReviewSnippets_GroundTruth.txt')
  with tarfile.open(path, 'r:gz') as tar:
    names = set(tar.getnames())
    if INNER_ARCHIVE in names:  # the sdist
      inner = _read_member(tar, INNER_ARCHIVE, path)
      path = f'{path}:{INNER_ARCHIVE}'
      tar = tarfile.open(fileobj=io.BytesIO(inner), mode='r:gz')
    where = f'{path}:{RATINGS_FILE}'
    return parse_ratings(_read_member(tar, RATINGS_FILE, where), where)


def _read_member(tar: tarfile.TarFile, member: str, where: str) -> bytes:
  f = tar.extractfile(member) if member in tar.getnames() else None
  if f is None:
    raise FileNotFoundError(f'{where}: no {member} in the archive (expected {SDIST} or '
                            'hutto_ICWSM_2014.tar.gz)')
  return f.read()


def parse_ratings(raw: bytes, path: str) -> list[Snippet]:
  """`id<TAB>rating<TAB>sentence` lines, UTF-8, CRLF or LF ends."""
  out = []
  for line_no, line in enumerate(raw.split(b'\n'), 1):
    try:
      text = line.decode('utf-8-sig' if line_no == 1 else 'utf-8').rstrip('\r')
    except UnicodeDecodeError as e:
      raise data_error(path, line_no, None, f'not UTF-8 ({e.reason} at byte {e.start})') from None
    if text:
      out.append(_snippet(text, path, line_no))
  return require_examples(out, path)


def _snippet(text: str, path: str, line_no: int) -> Snippet:
  fields = text.split('\t')
  if len(fields) != 3:
    raise data_error(path, line_no, None, f'expected 3 tab-separated columns (id, rating, '
                     f'sentence), found {len(fields)}')
  try:
    snippet_id = int(fields[0])
  except ValueError:
    raise data_error(path, line_no, 'id', f'{fields[0]!r} is not an integer') from None
  try:
    rating = float(fields[1])
  except ValueError:
    raise data_error(path, line_no, 'rating', f'{fields[1]!r} is not a number') from None
  if not -4 <= rating <= 4:
    raise data_error(path, line_no, 'rating', f'{rating} is outside [-4, 4]')
  return Snippet(snippet_id, rating, fields[2])


def mr_examples(snippets: list[Snippet], task: str = 'classification') -> list[Example]:
  """The labelled snippets (|rating| >= 0.5) as Examples: label '0'/'1', or the rating."""
  if task not in ('classification', 'regression'):
    raise ValueError(f'task={task!r}: expected classification or regression')
  out = []
  for s in snippets:
    if abs(s.rating) >= THRESHOLD:
      label = s.rating if task == 'regression' else LABELS[s.rating > 0]
      out.append(Example(guid=f'mr-{s.id}', text_a=s.text, text_b=None, label=label,
                         index=s.id))
  return out


def mr_splits(snippets: list[Snippet], seed: int = 0, task: str = 'classification'
              ) -> dict[str, list[Example]]:
  """train/dev/test = 80/10/10 of the labelled snippets shuffled by `random.Random(seed)`."""
  examples = mr_examples(snippets, task)
  random.Random(seed).shuffle(examples)
  n = len(examples)
  n_train, n_dev = n * 8 // 10, n // 10
  return {'train': examples[:n_train], 'dev': examples[n_train:n_train + n_dev],
          'test': examples[n_train + n_dev:]}
