r"""A real English corpus of about 2.2M words for the data benchmarks, from Debian packages.

Nothing can be downloaded from the web here, but apt reaches Debian, which ships two large
bodies of real prose:
  * the King James Bible (`bible-kjv-text`, read through its `bible` program): one document
    per chapter, one verse per line (0.79M words), as in the reference fixtures;
  * the Python 3.11 documentation's reStructuredText sources (`python3.11-doc`, unpacked with
    `dpkg -x`, not installed): one document per page, prose paragraphs only (markup, tables,
    code and directives dropped), split into sentences by `corpus.split_sentences` (1.2M words).

  sudo apt-get install -y bible-kjv                     # once
  python benchmarks/real_corpus.py --out /tmp/bench_corpus --repeat 4

writes, in the reference format, `real.txt` (all documents, shuffled with a fixed seed so both
sources mix), `real_1m.txt` (its first documents up to 1M words) and, with `--repeat N`,
`real_xN.txt` (all documents N times: only for measuring memory against corpus size).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import tempfile

import harness
from input_pipeline.pretrain.corpus import split_sentences, write_text_file

_VERSE = re.compile(r'^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$')
_ROLE = re.compile(r':[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`')
_LITERAL = re.compile(r'``([^`]*)``')
_LINK = re.compile(r'`([^`<]*?)\s*<[^>]*>`_+')
_UNDERLINE = re.compile(r'^([=\-~^"*+#.`:\'])\1{2,}\s*$')


def kjv_documents():
  out = harness.run(['bible', '-f', 'Gen1:1-Rev22:21']).stdout
  docs, current, key = [], [], None
  for line in out.splitlines():
    m = _VERSE.match(line.strip())
    if not m:
      continue
    chapter = (m.group(1), m.group(2))
    if chapter != key and current:
      docs.append(current)
      current = []
    key = chapter
    current.append(m.group(4).strip())
  if current:
    docs.append(current)
  return docs


def _clean_inline(text: str) -> str:
  text = _ROLE.sub(r'\1', text)
  text = _LINK.sub(r'\1', text)
  text = _LITERAL.sub(r'\1', text)
  return text.replace('\\', '')


def rst_prose_paragraphs(source: str) -> list[str]:
  """Prose paragraphs of one reStructuredText page; everything that is not prose goes."""
  paragraphs, literal_next = [], False
  for block in re.split(r'\n\s*\n', source):
    lines = [l for l in block.splitlines() if l.strip()]
    if not lines:
      continue
    if literal_next and lines[0].startswith((' ', '\t')):
      continue  # the indented literal block after '::'
    literal_next = lines[-1].rstrip().endswith('::')
    lines = [l.strip() for l in lines
             if not l.lstrip().startswith(('.. ', '>>>', '...', '+', '|', ':'))
             and not _UNDERLINE.match(l.strip())]
    text = _clean_inline(' '.join(lines)).rstrip(':')
    if len(text.split()) >= 6 and text[-1:] in '.!?' and text[:1].isalpha():
      paragraphs.append(text)
  return paragraphs


def python_doc_documents(workdir: str):
  harness.run(['apt-get', 'download', 'python3.11-doc'], cwd=workdir)
  deb = glob.glob(os.path.join(workdir, 'python3.11-doc_*.deb'))[0]
  harness.run(['dpkg', '-x', deb, os.path.join(workdir, 'x')])
  docs = []
  for path in sorted(glob.glob(os.path.join(workdir, 'x', '**', '*.rst.txt'), recursive=True)):
    with open(path, encoding='utf-8') as f:
      sentences = [s for p in rst_prose_paragraphs(f.read()) for s in split_sentences(p)]
    if len(sentences) >= 2:
      docs.append(sentences)
  return docs


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='/tmp/bench_corpus')
  parser.add_argument('--repeat', type=int, default=0)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    docs = kjv_documents() + python_doc_documents(tmp)
  random.Random(0).shuffle(docs)
  counts = [sum(len(s.split()) for s in d) for d in docs]
  words = sum(counts)
  path = os.path.join(args.out, 'real.txt')
  write_text_file(docs, path)
  print(f'{path}: {len(docs):,} documents, {words:,} words')
  n, total = 0, 0
  while total < 1_000_000:
    total, n = total + counts[n], n + 1
  write_text_file(docs[:n], os.path.join(args.out, 'real_1m.txt'))
  print(f'{os.path.join(args.out, "real_1m.txt")}: {n:,} documents, {total:,} words')
  if args.repeat > 1:
    big = os.path.join(args.out, f'real_x{args.repeat}.txt')
    write_text_file((d for _ in range(args.repeat) for d in docs), big)
    print(f'{big}: {len(docs) * args.repeat:,} documents, {words * args.repeat:,} words')


if __name__ == '__main__':
  main()
