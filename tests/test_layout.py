"""The layout's import rules (issue 20): arrows point one way and close no cycle.

  - `input_pipeline` never imports `bert_jax`: the data code runs without the model;
  - `bert_jax/model` never imports training, pretrain, finetune or convert;
  - `bert_jax/training` never imports pretrain, finetune or convert: setup receives the loss;
  - no import cycle among the modules of bert_jax, input_pipeline, configs and benchmarks;
  - benchmarks never import a command-line module (main, export, aot, demo, finetune's
    `__main__`): they time and call the library a user's command runs;
  - configs never import bert_jax: a config is data (no rule table or preset is read from,
    or written into, the code at import);
  - the family converters (hf_bert, hf_roberta, hf_electra, hf_modern) are siblings on
    hf_base and bert_state_map: none imports another or a module built on them, so a sixth
    family is one more sibling, not another floor.

Files are read with `ast`, nothing is imported. Every import counts: module-level and inside
functions, `import a.b` and `from a import b`, relative imports resolved against the package.
A benchmark script's top-level `import x` finds `benchmarks/x.py` first, as Python does for a
script's own directory. `check` takes any root, so the self-test can give it a small tree
with each kind of violation and see it reported.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TREES = ('bert_jax', 'input_pipeline', 'configs', 'benchmarks')
COMMANDS = ('bert_jax.main', 'bert_jax.export', 'bert_jax.aot', 'bert_jax.demo',
            'bert_jax.finetune.__main__')

# The family converters (bert_jax/convert/hf_<family>.py), siblings on hf_base and
# bert_state_map, and the convert modules built on top of them.
FAMILY_CONVERTERS = ('hf_bert', 'hf_roberta', 'hf_electra', 'hf_modern')
CONVERT_UPPER = ('hf', 'hf_heads', 'loaders', 'start_points', 'staging', 'google_tf', 'casing',
                 'workdir', 'run_export', 'sentence_transformers_export', 'fill_mask')

# (rule, importer's package, packages it must not import)
ARROWS = (
    ('input_pipeline never imports bert_jax', 'input_pipeline', ('bert_jax',)),
    ('the model never imports training, pretrain, finetune or convert', 'bert_jax.model',
     ('bert_jax.training', 'bert_jax.pretrain', 'bert_jax.finetune', 'bert_jax.convert')),
    ('training never imports pretrain, finetune or convert (setup receives the loss)',
     'bert_jax.training', ('bert_jax.pretrain', 'bert_jax.finetune', 'bert_jax.convert')),
    ('benchmarks never import a command-line module', 'benchmarks', COMMANDS),
    ('configs never import bert_jax (a config is data the code reads; rule tables and presets '
     'stay in the code)', 'configs', ('bert_jax',)),
    *(((f'a family converter stands beside the others on hf_base and bert_state_map, never on '
        f'a sibling or the modules built on them', f'bert_jax.convert.{m}',
        tuple(f'bert_jax.convert.{o}' for o in FAMILY_CONVERTERS + CONVERT_UPPER if o != m))
       for m in FAMILY_CONVERTERS + ('hf_base', 'bert_state_map'))),
)


@dataclasses.dataclass(frozen=True)
class Import:
  importer: str  # module names
  target: str
  file: str  # the importing file, relative to the root
  line: int

  def where(self) -> str:
    return f'{self.file}:{self.line}'


def _within(module: str, package: str) -> bool:
  return module == package or module.startswith(package + '.')


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Module name -> file, for every .py file under the trees (`pkg/__init__.py` is `pkg`)."""
  out = {}
  for tree in TREES:
    for path in sorted((root / tree).rglob('*.py')):
      parts = path.relative_to(root).with_suffix('').parts
      out['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  return out


def _known(name: str, known) -> str | None:
  """The longest prefix of dotted `name` that is one of our modules (None: third party)."""
  parts = name.split('.')
  for i in range(len(parts), 0, -1):
    prefix = '.'.join(parts[:i])
    if prefix in known:
      return prefix
  return None


def _resolve(name: str, importer: str, known) -> str | None:
  if _within(importer, 'benchmarks'):  # a script's own directory comes first on sys.path
    local = _known(f'benchmarks.{name}', known)
    if local not in (None, 'benchmarks'):
      return local
  return _known(name, known)


def _targets(node: ast.AST, importer: str, is_package: bool, known) -> list[str]:
  """Our modules that one `import` / `from ... import` statement imports."""
  if isinstance(node, ast.Import):
    return [t for t in (_resolve(a.name, importer, known) for a in node.names) if t]
  base = node.module or ''
  if node.level:  # relative: from the importer's package, up `level - 1` packages
    package = importer.split('.') if is_package else importer.split('.')[:-1]
    package = package[:len(package) - (node.level - 1)]
    base = '.'.join(package + ([node.module] if node.module else []))
  targets = []
  for alias in node.names:
    submodule = f'{base}.{alias.name}' if base else alias.name
    if alias.name != '*' and submodule in known:  # `from pkg import module`
      targets.append(submodule)
    else:
      target = _resolve(base, importer, known) if base else None
      if target:
        targets.append(target)
  return targets


def imports(root: pathlib.Path) -> list[Import]:
  """Every import of one of our modules by one of our modules, in file and line order."""
  known = modules(root)
  out = []
  for importer, path in known.items():
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    file = str(path.relative_to(root))
    is_package = path.name == '__init__.py'
    for node in ast.walk(tree):  # every depth: function-local imports count too
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        for target in _targets(node, importer, is_package, known):
          if target != importer:
            out.append(Import(importer, target, file, node.lineno))
  return sorted(out, key=lambda i: (i.file, i.line, i.target))


def arrow_violations(edges: list[Import]) -> list[str]:
  out = []
  for rule, package, forbidden in ARROWS:
    for e in edges:
      if _within(e.importer, package) and any(_within(e.target, f) for f in forbidden):
        out.append(f'{e.where()}: {e.importer} imports {e.target}: {rule}')
  return out


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan, iterative)."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(graph[start]))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(graph.get(child, ()))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        members = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          members.append(member)
          if member == node:
            break
        if len(members) > 1:
          out.append(sorted(members))
  return out


def _shortest_cycle(start: str, members: set[str], graph) -> list[str]:
  """start -> ... -> start inside one component (breadth first: the shortest)."""
  parent, frontier = {}, [start]
  while frontier:
    following = []
    for node in frontier:
      for child in graph[node]:
        if child == start:
          path = [node]
          while path[-1] != start:
            path.append(parent[path[-1]])
          return path[::-1] + [start]
        if child in members and child not in parent:
          parent[child] = node
          following.append(child)
    frontier = following
  raise AssertionError(f'{start}: no cycle in its component')


def cycle_violations(edges: list[Import]) -> list[str]:
  """One line per import cycle: each import of one shortest cycle, with its file and line."""
  first = {}
  for e in edges:
    first.setdefault((e.importer, e.target), e)
  graph = {}
  for importer, target in first:
    graph.setdefault(importer, []).append(target)
    graph.setdefault(target, [])
  out = []
  for members in _components(graph):
    cycle = _shortest_cycle(members[0], set(members), graph)
    steps = '; '.join(f'{first[a, b].where()} imports {b}' for a, b in zip(cycle, cycle[1:]))
    out.append(f'import cycle {" -> ".join(cycle)} ({steps}); its component: '
               f'{", ".join(members)}')
  return out


def check(root: pathlib.Path) -> list[str]:
  edges = imports(root)
  return arrow_violations(edges) + cycle_violations(edges)


def test_the_layout_keeps_its_import_rules():
  violations = check(ROOT)
  assert not violations, ('import rules broken (tests/test_layout.py says why each holds):\n  '
                          + '\n  '.join(violations))


def write(root: pathlib.Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_checker_catches_back_arrows_and_cycles(tmp_path):
  """A small tree with one violation of each kind, in each import form: the checker names
  every one with its file and line, and nothing else; without them the tree is clean."""
  clean = {
      'bert_jax/__init__.py': '',
      'bert_jax/demo.py': '',
      'bert_jax/model/__init__.py': '',
      'bert_jax/model/encoder.py': 'import numpy as np\n',
      'bert_jax/training/__init__.py': '',
      'bert_jax/training/optim.py': 'from bert_jax.model import encoder\n',
      'bert_jax/pretrain/__init__.py': '',
      'bert_jax/pretrain/step.py': 'from bert_jax.training import optim\nfrom . import run\n',
      'bert_jax/pretrain/run.py': 'import bert_jax.training.optim\n',
      'input_pipeline/__init__.py': '',
      'input_pipeline/a.py': 'from input_pipeline import b\n',
      'input_pipeline/b.py': 'import os\n',
      'configs/__init__.py': '',
      'benchmarks/harness.py': 'from bert_jax.pretrain import step\n',
      'benchmarks/speed.py': 'import harness\nfrom bert_jax import training\n',
  }
  write(tmp_path, clean)
  assert check(tmp_path) == []
  write(tmp_path, {
      # a function-local, relative back-arrow: model -> training
      'bert_jax/model/encoder.py': ('import numpy as np\n\n\ndef f():\n'
                                    '  from ..training import optim\n'),
      # `import a.b` form: training -> pretrain, closing optim -> step -> optim
      'bert_jax/training/optim.py': ('from bert_jax.model import encoder\n'
                                     'import bert_jax.pretrain.step\n'),
      # `from . import` closing a cycle, and input_pipeline -> bert_jax
      'input_pipeline/b.py': 'import os\nfrom . import a\nfrom bert_jax.model.encoder import f\n',
      # a benchmark importing the demo (its own helper module `harness` is fine)
      'benchmarks/speed.py': 'import harness\nfrom bert_jax import training, demo\n',
  })
  got = check(tmp_path)
  arrows = [v for v in got if not v.startswith('import cycle')]
  assert arrows == [
      'input_pipeline/b.py:3: input_pipeline.b imports bert_jax.model.encoder: ' + ARROWS[0][0],
      'bert_jax/model/encoder.py:5: bert_jax.model.encoder imports bert_jax.training.optim: '
      + ARROWS[1][0],
      'bert_jax/training/optim.py:2: bert_jax.training.optim imports bert_jax.pretrain.step: '
      + ARROWS[2][0],
      'benchmarks/speed.py:2: benchmarks.speed imports bert_jax.demo: ' + ARROWS[3][0],
  ]
  cycles = [v for v in got if v.startswith('import cycle')]
  assert len(cycles) == 2, got
  assert cycles[0].startswith(
      'import cycle bert_jax.model.encoder -> bert_jax.training.optim -> bert_jax.model.encoder '
      '(bert_jax/model/encoder.py:5 imports bert_jax.training.optim; '
      'bert_jax/training/optim.py:1 imports bert_jax.model.encoder); its component: '
      'bert_jax.model.encoder, bert_jax.pretrain.run, bert_jax.pretrain.step, '
      'bert_jax.training.optim'), cycles[0]
  assert cycles[1] == (
      'import cycle input_pipeline.a -> input_pipeline.b -> input_pipeline.a '
      '(input_pipeline/a.py:1 imports input_pipeline.b; input_pipeline/b.py:2 imports '
      'input_pipeline.a); its component: input_pipeline.a, input_pipeline.b'), cycles[1]
