"""The training endpoint reachable from inside a local SWE-Gym sandbox, whose commands have no network: for an agent
program (a CLI coding agent) that runs inside the episode's sandbox, so that the shell commands it runs itself run
there too, on the checkout that is graded.

    with SandboxEndpoint(env.sandbox, session.base_url) as relay:
        env.sandbox.run(relay.command("codex exec ..."), timeout=...)

Two halves: the trainer binds a Unix socket in the sandbox's scratch folder (`LocalSandbox.bind_scratch_socket`,
owned by the commands' uid) and relays each connection to the endpoint's loopback port; inside the sandbox,
`RELAY_JS` (run by node, which an npm agent needs anyway) listens on a free loopback port of the sandbox's own network
namespace, relays each connection to the socket, and runs the agent's command with `OPENAI_BASE_URL` (and
`OPENAI_API_BASE`, `ANTHROPIC_BASE_URL`) set to it, exiting with its exit status. Only the endpoint is reachable this
way, and only with the episode's key; when the command ends (or the sandbox's time limit kills it) the relay ends
with it, and the trainer's half closes with the context.
"""

from __future__ import annotations

import shlex
import socket
import threading
from contextlib import suppress
from urllib.parse import urlsplit

from ..envs.swegym import LocalSandbox, SandboxError

RELAY_JS = r"""// trl-multiturn: the training endpoint on this sandbox's loopback, relayed to the trainer's Unix socket
const net = require('net'), { spawn } = require('child_process');
const server = net.createServer(c => {
  const u = net.connect(process.env.TRL_MULTITURN_SOCKET);
  c.pipe(u); u.pipe(c);
  c.on('error', () => u.destroy()); u.on('error', () => c.destroy());
});
server.listen(0, '127.0.0.1', () => {
  const root = `http://127.0.0.1:${server.address().port}`;
  const env = { ...process.env, OPENAI_BASE_URL: `${root}/v1`, OPENAI_API_BASE: `${root}/v1`,
                ANTHROPIC_BASE_URL: root };
  const child = spawn(process.argv[2], process.argv.slice(3), { stdio: 'inherit', env });
  child.on('error', e => { console.error(`${process.argv[2]}: ${e.message}`); process.exit(127); });
  child.on('exit', (code, signal) => process.exit(code === null ? 128 : code));
});
"""


class SandboxEndpoint:
    """The endpoint at `base_url` relayed into `sandbox` (a started `LocalSandbox`) while the context is open; see
    the module docstring. `command(script)` is the sandbox command that runs `script` (a shell script) with the
    endpoint in its environment and `api_key` as `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`."""

    def __init__(self, sandbox: LocalSandbox, base_url: str, api_key: str):
        if not isinstance(sandbox, LocalSandbox):
            raise SandboxError(f"an agent program runs inside the local sandbox only (sandbox='local'), not in "
                               f"{type(sandbox).__name__}")
        url = urlsplit(base_url)
        self.sandbox, self.api_key, self.target = sandbox, api_key, (url.hostname, url.port)
        self.listener: socket.socket | None = None
        self.socket_path = self.script_path = ""
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> SandboxEndpoint:
        self.script_path = self.sandbox.write_scratch("trl_multiturn_relay.js", RELAY_JS)
        self.listener, self.socket_path = self.sandbox.bind_scratch_socket("trl_multiturn_endpoint.sock")
        threading.Thread(target=self._accept, args=(self.listener,), name="sandbox-endpoint", daemon=True).start()
        return self

    def command(self, script: str) -> str:
        exports = {"OPENAI_API_KEY": self.api_key, "ANTHROPIC_API_KEY": self.api_key,
                   "TRL_MULTITURN_SOCKET": self.socket_path}
        return ("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items())
                + f"; exec node {shlex.quote(self.script_path)} sh -c {shlex.quote(script)}")

    def __exit__(self, *exc) -> None:
        with self._lock:
            listener, self.listener = self.listener, None
            connections, self._connections = list(self._connections), set()
        if listener is not None:
            with suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            listener.close()
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(inside,), name="sandbox-endpoint-relay", daemon=True).start()

    def _relay(self, inside: socket.socket) -> None:
        try:
            endpoint = socket.create_connection(self.target)
        except OSError:
            inside.close()
            return
        with self._lock:
            if self.listener is None:  # closed meanwhile
                inside.close(), endpoint.close()
                return
            self._connections.update((inside, endpoint))
        back = threading.Thread(target=_pump, args=(endpoint, inside), daemon=True)
        back.start()
        _pump(inside, endpoint)
        back.join()
        with self._lock:
            self._connections.difference_update((inside, endpoint))
        inside.close(), endpoint.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy `source` to `target` until `source` ends, then end `target`'s writing side."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            target.shutdown(socket.SHUT_WR)
