"""A stand-in for `gcloud` in tests of launch/tpu_pod.sh: answers the `compute tpus` commands
the script issues from a scripted sequence of Cloud TPU states, and records every call.

$FAKE_GCLOUD is a directory holding state.json:
  node, qr: the states `tpu-vm describe --format=value(state)` and `queued-resources describe
    --format=value(state.state)` answer, in order (the last one repeats); [] = NOT_FOUND.
  accelerator: the VM's acceleratorType (`--format=value(state,acceleratorType)` answers
    "STATE<tab>TYPE"); a create sets it from --accelerator-type.
  node_on_create, qr_on_create: the sequences a create starts (READY; WAITING_FOR_RESOURCES,
    ACTIVE); a queued resource that reports ACTIVE brings its VM up READY.
  workers: how many hosts the slice has (networkEndpoints).
  ssh: [[substring, reply(, changes)], ...]: an ssh whose --command contains substring prints
    reply once per worker ({worker} is its index; a list: one reply per worker), then applies
    changes to the state (what happened meanwhile: {"node": ["PREEMPTED"]}; {"exit": 255}
    makes the ssh exit 255 instead, as gcloud does once its retries are spent); the first
    match wins.
  homes: one directory per worker: a command that no reply matches runs there (bash, with
    HOME and the working directory set to it), as on a worker; without homes it is only
    recorded.
  drops: [[substring, n], ...]: on homes, the connection of such a command drops after it ran,
    n times per worker; like gcloud (_AttemptSSHWithRetries: up to 10 attempts) the fake then
    runs the command again there (gcloud waits 5 s between attempts; the fake does not).
Like gcloud: describing or deleting what does not exist fails with NOT_FOUND, creating what
exists with ALREADY_EXISTS, deleting a queued resource that holds a VM needs --force (which
deletes the VM too), and ssh/scp to a VM that is not READY fail. Every call is appended to
calls.jsonl as its argument list.
"""

import concurrent.futures
import json
import os
import subprocess
import sys


def load(path):
  with open(path) as f:
    return json.load(f)


def current(seq):
  return seq[0] if seq else None


def advance(state, key):
  """The state `key` reports now; the sequence moves on (its last state stays)."""
  seq = state[key]
  now = current(seq)
  if len(seq) > 1:
    seq.pop(0)
  return now


def fail(what, code):
  print(f'ERROR: (gcloud.compute.tpus.{what}) {code}: fake gcloud', file=sys.stderr)
  return 1


def flag(args, name):
  for a in args:
    if a.startswith(f'--{name}='):
      return a.split('=', 1)[1]
  return None


def tpus(state, group, verb, args):
  fmt = flag(args, 'format')
  if group == 'tpu-vm':
    exists = bool(state['node'])
    if verb == 'describe':
      if not exists:
        return fail('tpu-vm.describe', 'NOT_FOUND')
      if fmt == 'value(state)':
        print(advance(state, 'node'))
      elif fmt == 'value(state,acceleratorType)':
        print(f'{advance(state, "node")}\t{state.get("accelerator", "")}')
      elif fmt == 'value(networkEndpoints[].ipAddress)':
        print(';'.join(f'10.0.0.{i + 2}' for i in range(state.get('workers', 1))))
      else:
        return fail('tpu-vm.describe', f'fake gcloud has no --format={fmt}')
      return 0
    if verb == 'create':
      if exists:
        return fail('tpu-vm.create', 'ALREADY_EXISTS')
      state['node'] = list(state.get('node_on_create', ['READY']))
      state['accelerator'] = flag(args, 'accelerator-type')
      return 0
    if verb == 'delete':
      if not exists:
        return fail('tpu-vm.delete', 'NOT_FOUND')
      state['node'] = []
      return 0
    if verb in ('ssh', 'scp'):
      if current(state['node']) != 'READY':
        return fail(f'tpu-vm.{verb}', f'the TPU VM is {current(state["node"])}, not READY')
      return ssh(state, flag(args, 'command')) if verb == 'ssh' else 0
  if group == 'queued-resources':
    exists = bool(state['qr'])
    if verb == 'describe':
      if not exists:
        return fail('queued-resources.describe', 'NOT_FOUND')
      now = advance(state, 'qr')
      if now == 'ACTIVE' and not state['node']:
        state['node'] = ['READY']
      print(now)
      return 0
    if verb == 'create':
      if exists:
        return fail('queued-resources.create', 'ALREADY_EXISTS')
      state['qr'] = list(state.get('qr_on_create', ['WAITING_FOR_RESOURCES', 'ACTIVE']))
      state['accelerator'] = flag(args, 'accelerator-type')
      return 0
    if verb == 'delete':
      if not exists:
        return fail('queued-resources.delete', 'NOT_FOUND')
      if state['node'] and '--force' not in args:
        return fail('queued-resources.delete', 'FAILED_PRECONDITION: it has a node; use --force')
      state['qr'], state['node'] = [], []
      return 0
  return fail(f'{group}.{verb}', 'fake gcloud does not know this command')


def ssh(state, command):
  workers = state.get('workers', 1)
  for substring, reply, *changes in state.get('ssh', []):
    if substring in command:
      for i in range(workers):
        text = reply[i] if isinstance(reply, list) else reply.format(worker=i)
        if text:
          print(text, flush=True)
      code = 0
      for change in changes:
        change = dict(change)
        code = change.pop('exit', code)
        state.update(change)
      return code
  homes = state.get('homes')
  if not homes:
    return 0
  drops = sum(n for substring, n in state.get('drops', []) if substring in command)
  with concurrent.futures.ThreadPoolExecutor(len(homes)) as pool:
    return max(pool.map(lambda home: on_worker(home, command, drops), homes))


def on_worker(home, command, drops):
  """The command's exit status on one worker, through gcloud's retries of a dropped connection."""
  for attempt in range(10):
    code = subprocess.run(['bash', '-c', command], cwd=home,
                          env=dict(os.environ, HOME=home)).returncode
    if attempt >= drops:
      return code
    print('Retrying: SSH command error: [/usr/bin/ssh] exited with return code [255].',
          file=sys.stderr, flush=True)
  return 255


def main(argv):
  root = os.environ['FAKE_GCLOUD']
  with open(os.path.join(root, 'calls.jsonl'), 'a') as f:
    f.write(json.dumps(argv) + '\n')
  path = os.path.join(root, 'state.json')
  state = load(path)
  if argv[:2] != ['compute', 'tpus'] or len(argv) < 4:
    return fail(' '.join(argv[:3]), 'fake gcloud does not know this command')
  words = [a for a in argv[2:] if not a.startswith('--')]
  try:
    code = tpus(state, words[0], words[1], argv[4:])
  except KeyboardInterrupt:  # Ctrl-C reaches gcloud and its ssh alike
    code = 130
  with open(path, 'w') as f:
    json.dump(state, f)
  return code


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
