"""LLVM's optimizer in helper processes, for a process that compiles for a long time.

Building and running llvmlite's O3 module pipeline keeps native memory that nothing frees
(66 KiB for a one-loop module, 114 KiB a compile of a small MLP; docs/reliability.md);
parsing, code generation and loading objects keep nothing. A process that compiles model
after model (a server, the test suite, the tuner) would grow without end. So after
`IN_PROCESS_MODULES` modules, the rest are compiled in helper processes: each takes LLVM
IR text and returns the object code (`ember.codegen.cpu._compile_alone`, the same call),
and is replaced after `MODULES_PER_HELPER` modules, which returns what it kept to the
system. A module then costs a pipe transfer of its IR and its object, and a helper's first
its start (importing Ember: about 1 s of CPU); helpers are kept between compiles, as many
as compile at once (one per usable core).

    EMBER_LLVM_IN_PROCESS=<modules>  # how many modules before the helpers (default 256)
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any

from ember.codegen import CodegenError

IN_PROCESS_MODULES = int(os.environ.get("EMBER_LLVM_IN_PROCESS", "256"))
MODULES_PER_HELPER = 256
_HEADER = struct.Struct("<Q")


def _send(stream: Any, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the helper closed its pipe")
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


class _Helper:
    """One helper process: a request at a time."""

    def __init__(self):
        env = {**os.environ, "EMBER_LLVM_IN_PROCESS": str(1 << 62)}  # (no helpers of its own)
        self.process = subprocess.Popen([sys.executable, "-m", "ember.codegen.helpers"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.served = 0

    def compile(self, text: str, opt: int, target: Any, jit: bool) -> Any:
        try:
            _send(self.process.stdin, (text, opt, target, jit))
            ok, result = _receive(self.process.stdout)
        except (OSError, EOFError, pickle.PickleError) as e:
            self.close()
            raise CodegenError(f"the LLVM helper process failed: {e}") from None
        self.served += 1
        if not ok:
            raise CodegenError(result)
        return result

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


class _Pool:
    """Idle helpers, taken one per module compile and put back after it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.idle: list[_Helper] = []
        self.compiled_here = 0
        self.pid = os.getpid()

    def in_process(self) -> bool:
        """Whether the next module is compiled in this process (counting it)."""
        with self.lock:
            self.compiled_here += 1
            return self.compiled_here <= IN_PROCESS_MODULES

    def compile(self, text: str, opt: int, target: Any, jit: bool) -> Any:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: the helpers are its parent's
                self.idle, self.pid = [], os.getpid()
            helper = self.idle.pop() if self.idle else None
        helper = helper or _Helper()
        try:
            result = helper.compile(text, opt, target, jit)
        except CodegenError:
            if helper.process.poll() is not None:  # (dead: not put back)
                raise
            self._put_back(helper)
            raise
        self._put_back(helper)
        return result

    def _put_back(self, helper: _Helper) -> None:
        if helper.served >= MODULES_PER_HELPER:
            helper.close()  # a fresh one next time: what this one kept goes back
            return
        with self.lock:
            self.idle.append(helper)

    def close(self) -> None:
        with self.lock:
            helpers, self.idle = self.idle, []
        for helper in helpers:
            helper.close()


POOL = _Pool()
atexit.register(POOL.close)


def _serve() -> None:
    """The helper's loop: (text, opt, target, jit) in, (ok, objects or message) out."""
    from ember.codegen import cpu

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # (nothing else may write to the reply pipe)
    while True:
        try:
            text, opt, target, jit = _receive(requests)
        except EOFError:
            return
        try:
            reply = (True, cpu._compile_alone(text, opt, functools.partial(
                cpu.new_target_machine, target, opt, jit)))
        except CodegenError as e:
            reply = (False, str(e))
        _send(replies, reply)


if __name__ == "__main__":
    _serve()
