"""A Compute Engine metadata server on localhost that answers `instance/maintenance-event` and
(on a spot VM) `instance/preempted` as the real one does (text, `Metadata-Flavor: Google`
required, 404 for what it does not have), with values the test sets."""

from __future__ import annotations

import http.server
import threading

EVENT_PATH = '/computeMetadata/v1/instance/maintenance-event'
PREEMPTED_PATH = '/computeMetadata/v1/instance/preempted'


class MetadataServer:

  def __init__(self, event: str = 'NONE', preempted: str | None = 'FALSE'):
    self.event = event
    self.preempted = preempted  # None: not a spot VM (404)
    self.cut_off = False  # True: replies end before their Content-Length (IncompleteRead)
    self.requests = 0
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # noqa: N802 (http.server's name)
        if self.headers.get('Metadata-Flavor') != 'Google':
          self._reply(403, 'Missing required header "Metadata-Flavor": "Google"')
        elif self.path.split('?')[0] == EVENT_PATH:
          server.requests += 1
          self._reply(200, server.event)
        elif self.path.split('?')[0] == PREEMPTED_PATH and server.preempted is not None:
          self._reply(200, server.preempted)
        else:
          self._reply(404, 'not found')

      def _reply(self, code: int, text: str):
        body = text.encode()
        self.send_response(code)
        self.send_header('Metadata-Flavor', 'Google')
        self.send_header('Content-Type', 'application/text')
        self.send_header('Content-Length', str(len(body) + (100 if server.cut_off else 0)))
        self.end_headers()
        self.wfile.write(body)
        if server.cut_off:
          self.close_connection = True

      def log_message(self, *args):
        pass

    self._httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.host = f'127.0.0.1:{self._httpd.server_address[1]}'
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

  def __enter__(self) -> 'MetadataServer':
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._httpd.shutdown()
    self._httpd.server_close()
