"""Every command in README.md and docs/*.md still runs as written, checked without running it.

Each ```bash block is read as the shell would (continuation lines joined, comments dropped,
quotes removed) and every command in it must be one of:

  - `python -m MODULE ...` or `.venv/bin/python -m MODULE ...`: MODULE is run as a program in a
    subprocess up to its `absl.app.run`, which is replaced by a parse of the command's arguments
    with the module's own flags parser. So the module must exist and be runnable, every `--flag`
    must be one it defines, `--config=FILE:ARG` must build, every `--config.a.b=` override must
    name a field of that config and parse as its type, and required flags must be given. Flags
    the data tool leaves to Apache Beam (with `--runner`) must be options Beam knows.
  - `bash scripts/X.sh`: the script exists.
  - `launch/local_pod.sh N ...` and `launch/tpu_pod.sh ... -- ...`: the script exists, the
    launcher's options are arms of its `case`, and the rest is checked as the command of the
    module it runs (`MODULE`, default bert_jax.main, for local_pod.sh; bert_jax.main for
    tpu_pod.sh).
  - `export VAR=...`: nothing to check.
  - a program listed in UNCHECKED, with the reason and the test that covers it instead.

`...` elides arguments; `--flag=...` checks that the flag or config field exists, not a value;
`[--flag]` is an optional flag, checked like any other. docs/benchmark_log.md is left out (HISTORY):
it records what ran at the commits it names.

Each ```python block is parsed, not run (its inputs are the reader's): its imports must import,
every attribute it reads from an imported name must exist, and every call of an imported
function or class must bind to its signature (argument count, keyword names).

One subprocess per module (absl flags are process-global) and one for the Python blocks, all
started together. `test_a_wrong_command_is_reported` puts a block of wrong commands through the
same checks and expects each one reported.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import pathlib
import re
import runpy
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = ('README.md', *sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'docs').glob('*.md')))
PYTHONS = ('python', 'python3', '.venv/bin/python')
LOCAL_POD, TPU_POD = 'launch/local_pod.sh', 'launch/tpu_pod.sh'
TPU_POD_MODULE = 'bert_jax.main'  # what launch/run_worker.sh starts on every worker
# Programs whose commands this test cannot check, and what covers them instead.
UNCHECKED = {
    'gcloud': "Google Cloud's CLI, not this project's; tpu_pod.sh's gcloud commands are "
              'tests/test_launch.py\'s (fake gcloud, --dry-run)',
}
ELISION = '...'
PYTHON_JOB = 'python-blocks'
# A dated record of what ran at the commits it names, not instructions: rewriting its commands
# as the code moves on would rewrite the record (the demo's own check is tests/test_demo.py).
HISTORY = ('docs/benchmark_log.md',)


@dataclasses.dataclass(frozen=True)
class Command:
  where: str  # 'README.md:42'
  words: tuple[str, ...]

  def __str__(self):
    return f'{self.where}: {shlex.join(self.words)}'


def python_blocks(text: str, name: str) -> list[tuple[str, str]]:
  """(where, source) of every ```python block."""
  blocks, source, start = [], None, 0
  for number, line in enumerate(text.splitlines(), 1):
    if source is None and line.strip() == '```python':
      source, start = [], number + 1
    elif source is not None and line.startswith('```'):
      blocks.append((f'{name}:{start}', '\n'.join(source)))
      source = None
    elif source is not None:
      source.append(line)
  return blocks


def bash_commands(text: str, name: str) -> list[Command]:
  """The commands of every ```bash block, one per (joined) line, with the line it starts on."""
  commands, block, start, joined = [], False, 0, ''
  for number, line in enumerate(text.splitlines(), 1):
    if line.startswith('```'):
      block = not block and line.strip() == '```bash'
      continue
    if not block:
      continue
    if not joined:
      start = number
    if line.rstrip().endswith('\\'):
      joined += line.rstrip()[:-1] + ' '
      continue
    words = shlex.split(joined + line, comments=True)
    joined = ''
    if words:
      commands.append(Command(f'{name}:{start}', tuple(words)))
  return commands


@dataclasses.dataclass
class Plan:
  """What to check in subprocesses (module commands, Python blocks), and what is settled: problems
  found already, commands left to other tests, the count of commands checked."""
  module_argvs: dict[str, list[tuple[Command, list[str]]]] = dataclasses.field(default_factory=dict)
  problems: list[str] = dataclasses.field(default_factory=list)
  unchecked: list[tuple[Command, str]] = dataclasses.field(default_factory=list)
  python: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (where, source)
  checked: int = 0


def plan(commands: list[Command], python: list[tuple[str, str]] = (),
         root: pathlib.Path = ROOT) -> Plan:
  p = Plan(python=list(python))
  for command in commands:
    words, env = list(command.words), {}
    while words and re.fullmatch(r'[A-Z_][A-Z0-9_]*=.*', words[0]):
      key, value = words.pop(0).split('=', 1)
      env[key] = value
    program = words[0] if words else ''
    if program in UNCHECKED:
      p.unchecked.append((command, UNCHECKED[program]))
      continue
    p.checked += 1
    if not words or program == 'export':
      continue
    if program in PYTHONS:
      if len(words) < 3 or words[1] != '-m':
        p.problems.append(f'{command}: only `python -m MODULE ...` is checked')
      else:
        p.module_argvs.setdefault(words[2], []).append((command, words[3:]))
    elif program == 'bash':
      script = next((w for w in words[1:] if not w.startswith('-')), '')
      if not (root / script).is_file():
        p.problems.append(f'{command}: no script {script}')
    elif program == LOCAL_POD:
      _plan_local_pod(command, words, env, root, p)
    elif program == TPU_POD:
      _plan_tpu_pod(command, words, root, p)
    else:
      p.problems.append(f'{command}: {program!r} is not a command this test knows; check it '
                        'here or add it to UNCHECKED with the test that covers it')
  return p


def _plan_local_pod(command, words, env, root, p):
  script = (root / LOCAL_POD).read_text()
  default = re.search(r'module=\$\{MODULE:-([\w.]+)\}', script).group(1)
  module = env.get('MODULE', default)
  if len(words) < 2 or not words[1].isdigit():
    p.problems.append(f'{command}: {LOCAL_POD} takes the process count first')
  else:
    p.module_argvs.setdefault(module, []).append((command, words[2:]))


def _plan_tpu_pod(command, words, root, p):
  script = (root / TPU_POD).read_text()
  options = {o for arm in re.findall(r'^\s*(--[\w|-]+)\)', script, re.M) for o in arm.split('|')}
  launcher, argv = (words[1:words.index('--')], words[words.index('--') + 1:]) \
      if '--' in words else (words[1:], [])
  for word in launcher:
    if word.startswith('-') and word not in options:
      p.problems.append(f'{command}: {TPU_POD} has no option {word} (it has {sorted(options)})')
  if argv:
    p.module_argvs.setdefault(TPU_POD_MODULE, []).append((command, argv))


def run_checks(p: Plan) -> list[str]:
  """The plan's problems plus every module command's, one subprocess per module at once."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      x for x in (str(ROOT), os.environ.get('PYTHONPATH')) if x), JAX_PLATFORMS='cpu')
  jobs = {module: [argv for _, argv in items] for module, items in p.module_argvs.items()}
  if p.python:
    jobs[PYTHON_JOB] = [source for _, source in p.python]
  procs = {}
  for job, inputs in jobs.items():  # one pipe each (stderr joins stdout): read to its end safely
    procs[job] = subprocess.Popen(
        [sys.executable, __file__, job], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    procs[job].stdin.write(json.dumps(inputs))
    procs[job].stdin.close()
  problems = list(p.problems)
  for module, proc in procs.items():
    out = proc.stdout.read()
    proc.wait(timeout=120)
    try:
      verdicts = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
      raise AssertionError(f'checking {module} failed:\n{out[-3000:]}') from None
    if module == PYTHON_JOB:
      problems += [f'{where}: {v}' for (where, _), v in zip(p.python, verdicts) if v]
      continue
    items = p.module_argvs[module]
    if isinstance(verdicts, str):  # the module itself did not run
      problems += [f'{command}: {verdicts}' for command, _ in items]
      continue
    problems += [f'{command}: {v}' for (command, _), v in zip(items, verdicts) if v]
  return problems


def commands_and_blocks(documents=DOCUMENTS):
  texts = {d: (ROOT / d).read_text() for d in documents if d not in HISTORY}
  return ([c for d, text in texts.items() for c in bash_commands(text, d)],
          [b for d, text in texts.items() for b in python_blocks(text, d)])


@pytest.fixture(scope='module')
def checked():
  """The documents' commands and blocks and the WRONG ones, checked in one batch of processes.
  Returns the documents' plan and the problems found in each (documents, WRONG)."""
  commands, blocks = commands_and_blocks()
  wrong_commands, wrong_blocks = bash_commands(WRONG, 'WRONG'), python_blocks(WRONG, 'WRONG')
  p = plan(commands + wrong_commands, blocks + wrong_blocks)
  problems = run_checks(p)
  ours = [x for x in problems if not x.startswith('WRONG:')]
  wrong = [x for x in problems if x.startswith('WRONG:')]
  return p, ours, wrong, wrong_commands


def test_every_command_in_readme_and_docs_names_what_exists(checked):
  p, problems, _, _ = checked
  assert not problems, '\n'.join(problems)
  readme = bash_commands((ROOT / 'README.md').read_text(), 'README.md')
  words = [c.words for c in readme]
  # The Quickstart stays first and as it is.
  assert words[:2] == [('bash', 'scripts/demo.sh'), ('bash', 'scripts/test.sh')]
  assert p.checked >= 40 and len(p.python) >= 3, (p.checked, len(p.python))


def test_unchecked_commands_are_the_listed_programs(checked):
  p = checked[0]
  assert {c.words[0] for c, _ in p.unchecked} <= set(UNCHECKED)


WRONG = r"""
```bash
.venv/bin/python -m bert_jax.main --config=configs/bert_tiny.py --workdir=runs/x --no_such_flag=1
.venv/bin/python -m bert_jax.main --config=configs/bert_tiny.py --workdir=runs/x \
    --config.model.no_such_field=1
.venv/bin/python -m bert_jax.main --config=configs/bert_tiny.py --workdir=runs/x \
    --config.model.num_layers=two
.venv/bin/python -m bert_jax.main --config=configs/modern.py:no_such_size --workdir=runs/x
.venv/bin/python -m bert_jax.main --config=configs/no_such_file.py --workdir=runs/x
.venv/bin/python -m bert_jax.finetune --config=configs/finetune.py:mrpc --init=runs/x
.venv/bin/python -m bert_jax.no_such_module --workdir=runs/x
python -m input_pipeline.pretrain.create_pretraining_data --input_file=a.txt --output_file=b \
    --no_such_option=1
python -m input_pipeline.pretrain.create_pretraining_data --input_file=a.txt --output_file=b \
    --runner=DirectRunner --no_such_beam_option=1
bash scripts/no_such_script.sh
launch/tpu_pod.sh --tpu t --no-such-option -- --config=configs/bert_base.py:phase1 --workdir=w
MODULE=bert_jax.finetune launch/local_pod.sh 2 --config=configs/finetune.py:mr --workdir=w \
    --config.data.no_such_field=...
frobnicate --all
.venv/bin/python -m bert_jax.main --config=configs/bert_tiny.py --workdir=runs/x \
    --config.mesh='(2,2,2)' [--mode=eval] --config.model.vocab_size=... ...
```

```python
from bert_jax.convert import hf, no_such_module
from bert_jax.model.encoder import BertConfig, NoSuchClass
hf.save_pretrained('my-bert', cfg, params, no_such_keyword=1)
hf.no_such_function('my-bert')
params = hf.load_pretrained('a', 'b', 'c', 'd')
```
"""
# What each wrong command above must be reported with, in order; the last command is right.
EXPECTED = (
    "Unknown command line flag 'no_such_flag'",
    'no_such_field',
    "--config.model.num_layers=two",
    'configs/modern.py:no_such_size',
    'no_such_file.py',
    '--workdir',
    'No module named bert_jax.no_such_module',
    'no_such_option',
    'no_such_beam_option',
    'no script scripts/no_such_script.sh',
    'no option --no-such-option',
    'no_such_field',
    "'frobnicate' is not a command this test knows",
)


# What the wrong Python block must be reported with.
EXPECTED_PYTHON = ('no_such_module', 'NoSuchClass', "unexpected keyword argument 'no_such_keyword'",
                   'hf.no_such_function', 'hf.load_pretrained(...): too many positional')


def test_a_wrong_command_is_reported(checked):
  _, _, problems, commands = checked
  for command, expected in zip(commands, EXPECTED):
    found = [x for x in problems if x.startswith(f'{command.where}:')]
    assert len(found) == 1 and expected in found[0], (command, expected, problems)
  right = commands[len(EXPECTED)]
  assert not [x for x in problems if x.startswith(f'{right.where}:')], problems
  block = [x for x in problems if x.startswith(f'{python_blocks(WRONG, "WRONG")[0][0]}:')]
  assert len(block) == 1 and all(e in block[0] for e in EXPECTED_PYTHON), block
  assert len(problems) == len(EXPECTED) + 1, problems


# ---- The checks in a subprocess: python tests/test_readme.py MODULE|PYTHON_JOB < inputs.json ----


class _Stop(Exception):
  pass


def _module_parser(module: str):
  """Runs MODULE as `__main__` up to app.run; its flags are then defined. Returns the flags
  parser app.run would use, or an error string."""
  # absl and the project are imported in the checking subprocess only: flags are process-global.
  from absl import app  # pylint: disable=g-import-not-at-top
  from bert_jax.training import host_malloc  # pylint: disable=g-import-not-at-top
  host_malloc.reexec_with_tuned_malloc = lambda: None
  seen = {}

  def run(main, argv=None, flags_parser=None, **kwargs):
    del main, argv, kwargs
    seen['parser'] = flags_parser
    raise _Stop

  app.run = run
  try:
    runpy.run_module(module, run_name='__main__', alter_sys=False)
  except _Stop:
    pass
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__}: {e}'
  if 'parser' not in seen:
    return f'{module} is not a program (it never calls absl.app.run)'
  return seen['parser']


def _check_argv(argv: list[str], parser) -> str:
  """'' when the arguments parse as the module's command would, else why not."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flags.FLAGS
  named = '=' + ELISION  # --flag=...: the name is checked, not a value
  words = [w[1:-1] if w.startswith('[') and w.endswith(']') else w for w in argv]
  words = [w for w in words if ELISION not in w or (w.startswith('--') and w.endswith(named))]
  named_only = [w[2:-len(named)] for w in words if w.endswith(named)]
  words = [w for w in words if not w.endswith(named)]
  values.unparse_flags()
  for name in [n for n in values if n.startswith('config.')]:  # the last command's overrides
    delattr(values, name)
  sys.argv = ['prog', *words]  # ml_collections reads --config.* overrides from sys.argv
  try:
    rest = (parser or values)(sys.argv)[1:]
    if 'config' in values and values.config is not None:
      _ = values.config.keys  # a config file that failed to load raises on first use
    for name in named_only:
      if name.startswith('config.'):
        node = values.config
        for part in name.split('.')[1:]:
          node = getattr(node, part)
      elif name not in values:
        return f'unknown flag --{name}'
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__}: {_first_lines(str(e))}'
  if rest:
    return _beam_leftovers(rest, values)
  return ''


def _beam_leftovers(rest: list[str], values) -> str:
  """The data tool hands flags it does not define to Beam, with --runner only."""
  if 'runner' not in values or not values.runner:
    return f'unknown flags {rest}'
  # pylint: disable-next=g-import-not-at-top
  from apache_beam.options.pipeline_options import PipelineOptions
  options = PipelineOptions(rest)
  unknown = set(options.get_all_options(retain_unknown_options=True)) - set(
      options.get_all_options())
  return f'flags neither the tool nor Beam defines: {sorted(unknown)}' if unknown else ''


def _first_lines(message: str) -> str:
  lines = [x for x in message.splitlines() if x.strip()]
  return ' / '.join(lines[:1] + lines[-1:]) if len(lines) > 1 else message


def _check_python(source: str) -> str:
  """'' when the block's imports, attributes of imported names and calls of them exist."""
  tree, names, problems = ast.parse(source), {}, []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        try:
          names[alias.asname or alias.name.split('.')[0]] = _imported(node, alias)
        except (ImportError, AttributeError) as e:
          problems.append(f'{ast.unparse(node)}: {e}')

  def resolve(expr):
    if isinstance(expr, ast.Name):
      return names.get(expr.id)
    if isinstance(expr, ast.Attribute):
      base = resolve(expr.value)
      if base is not None and not hasattr(base, expr.attr):
        problems.append(f'{ast.unparse(expr)}: no such attribute')
        return None
      return None if base is None else getattr(base, expr.attr)
    return None

  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and callable(fn := resolve(node.func)):
      try:
        signature = inspect.signature(fn)
      except (TypeError, ValueError):  # builtins without one
        continue
      try:
        signature.bind_partial(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
      except TypeError as e:
        problems.append(f'{ast.unparse(node.func)}(...): {e}')
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
      resolve(node)
  return '; '.join(dict.fromkeys(problems))


def _imported(node, alias):
  """What `import a.b as c` or `from a import b as c` binds to its name."""
  if isinstance(node, ast.Import):
    module = importlib.import_module(alias.name)
    return module if alias.asname else importlib.import_module(alias.name.split('.')[0])
  module = importlib.import_module(node.module)
  if hasattr(module, alias.name):
    return getattr(module, alias.name)
  try:
    return importlib.import_module(f'{node.module}.{alias.name}')
  except ImportError:
    raise ImportError(f'cannot import name {alias.name!r} from {node.module}') from None


def _check_main(job: str) -> None:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  inputs = json.load(sys.stdin)
  if job == PYTHON_JOB:
    sys.stdout.write('\n' + json.dumps([_check_python(source) for source in inputs]) + '\n')
    return
  module, argvs = job, inputs
  parser = _module_parser(module)
  if isinstance(parser, str):
    verdicts = parser
  else:
    verdicts = [_check_argv(argv, parser) for argv in argvs]
  sys.stdout.write('\n' + json.dumps(verdicts) + '\n')


if __name__ == '__main__':
  _check_main(sys.argv[1])
