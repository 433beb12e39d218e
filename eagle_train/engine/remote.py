"""An object living in its own spawned process, called by method name over a pipe.

Used for vLLM engines that must be alive side by side (an interleaved speed measurement,
one regeneration engine per GPU): each process has its own CUDA context, its own vLLM
distributed state and, with ``env``, its own visible devices. Nothing is inherited but the
environment and the pickled constructor arguments. A worker dies with the process that
started it (Linux: the parent-death signal), so a killed or preempted command leaves no
engine running behind it.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _die_with(parent: int) -> None:
    """SIGKILL this process when ``parent`` exits (an engine holds no user state)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _serve(
    conn: Any, factory: Callable[..., Any], args: tuple, env: dict[str, str], parent: int
) -> None:
    _die_with(parent)
    # A daemonic process may not start children: vLLM's engine core runs in this process.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.update(env)
    try:
        obj = factory(*args)
        conn.send(("ok", None))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        message = conn.recv()
        if message is None:
            close = getattr(obj, "close", None)
            if close is not None:
                close()
            conn.send(("ok", None))
            _exit_now()
        method, call_args = message
        try:
            conn.send(("ok", getattr(obj, method)(*call_args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _exit_now() -> None:
    """End the worker once its object is closed and the reply sent, without the interpreter's
    teardown: with torch and vLLM loaded that took 2.6 s a process on 2 CPU cores, and it
    holds nothing to save (what the object wrote, it closed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment for the block (a spawned child inherits it)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Remote:
    """``Remote(VllmEngine.create, ...)``: ``call("generate", prompts, sampling)`` runs the
    method in the child; ``submit`` + ``result`` let several remotes work at once."""

    def __init__(
        self, factory: Callable[..., Any], *args: Any, env: dict[str, str] | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, factory, args, env or {}, os.getpid()), daemon=True
        )
        with _environment(env or {}):  # in place as the child starts: its OpenMP runtime
            self.proc.start()  # reads OMP_NUM_THREADS when torch loads, before _serve runs
        try:
            self.result()
        except Exception:
            self.close()
            raise

    def submit(self, method: str, *args: Any) -> None:
        self.conn.send((method, args))

    def result(self) -> Any:
        try:
            status, payload = self.conn.recv()
        except EOFError:
            raise RuntimeError("a worker process died") from None
        if status == "error":
            raise RuntimeError(f"a worker process failed:\n{payload}")
        return payload

    def call(self, method: str, *args: Any) -> Any:
        self.submit(method, *args)
        return self.result()

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(None)
                if self.conn.poll(120):
                    self.conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
