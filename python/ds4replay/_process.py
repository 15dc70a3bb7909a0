"""Finding the ds4replay binary and running it with JSONL streamed through pipes."""

import collections
import json
import os
import shutil
import subprocess
import sys
import threading

__all__ = ["Ds4ReplayError", "find_binary", "run_json", "run_jsonl"]


class Ds4ReplayError(RuntimeError):
    """The ds4replay binary failed.

    Attributes: ``returncode`` (the exit code: 1 runtime failure, 2 usage or bad input,
    3 checkpoint problem, 130 interrupted; negative: killed by that signal), ``message`` (the
    binary's error message), ``stderr`` (the last lines it wrote to stderr), ``args`` of the run.
    """

    def __init__(self, returncode, message, stderr="", command=None):
        self.returncode = returncode
        self.message = message
        self.stderr = stderr
        self.command = command
        super().__init__("ds4replay exited with code %s: %s" % (returncode, message))


def _candidates():
    env = os.environ.get("DS4REPLAY_BIN")
    if env:
        yield env, "DS4REPLAY_BIN"
        return
    on_path = shutil.which("ds4replay")
    if on_path:
        yield on_path, "PATH"
    yield os.path.join(os.getcwd(), "build", "ds4replay"), "./build"
    # The repository this package was installed from (pip install -e python, or a source checkout).
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.normpath(os.path.join(here, "..", "..", "build", "ds4replay")), "the repository's build/"


def find_binary(binary=None):
    """Path of the ds4replay executable.

    Looked up in this order: the ``binary`` argument, the ``DS4REPLAY_BIN`` environment variable,
    ``ds4replay`` on PATH, ``./build/ds4replay`` relative to the current directory, and the
    ``build/ds4replay`` of the source tree this package lives in. Raises FileNotFoundError naming
    every place tried.
    """
    if binary is not None:
        path = os.fspath(binary)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        found = shutil.which(path)
        if found:
            return found
        raise FileNotFoundError("ds4replay binary %r (the binary= argument) is not an executable file" % path)
    tried = []
    for path, where in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        tried.append("%s (%s)" % (path, where))
    raise FileNotFoundError(
        "ds4replay binary not found; tried: " + ", ".join(tried)
        + ". Build it (scripts/setup.sh), put it on PATH, or set DS4REPLAY_BIN."
    )


def _error_message(lines):
    errors = [l.split("error:", 1)[1].strip() for l in lines if l.startswith("ds4replay: error:")]
    if errors:
        return "; ".join(errors)
    # A usage error (CLI11) spans a few lines ending in "Run with --help for more information.".
    rest = [l.strip() for l in lines if l.strip() and not l.startswith("Run with --help")]
    return " ".join(rest[-3:]) if rest else "(no message on stderr)"


def _json_default(obj):
    # numpy scalars and arrays (kept optional here: numpy is imported lazily).
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError("%r is not JSON serializable" % (obj,))


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False, default=_json_default)


def run_jsonl(binary, args, records=None, progress=False):
    """Runs ``binary args...``; yields each stdout line parsed as JSON.

    ``records`` (an iterable of JSON-serializable objects) are written to the process's stdin, one
    line each, from a separate thread, so input and output stream at the same time. stderr is read
    by another thread: passed through to ``sys.stderr`` when ``progress`` is true, and its tail kept
    for the error message. A non-zero exit raises Ds4ReplayError. Stopping the iteration early kills
    the process.
    """
    cmd = [binary] + [str(a) for a in args]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE if records is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tail = collections.deque(maxlen=200)
    writer_error = []

    def write_input():
        try:
            for rec in records:
                proc.stdin.write(dumps(rec).encode("utf-8") + b"\n")
        except BrokenPipeError:
            pass  # the process stopped reading: its exit code and stderr tell why
        except BaseException as e:  # noqa: BLE001 - reported after the process ends
            writer_error.append(e)
            proc.kill()
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    def read_stderr():
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            tail.append(line.rstrip("\n"))
            if progress:
                sys.stderr.write(line)
                sys.stderr.flush()

    threads = [threading.Thread(target=read_stderr, daemon=True)]
    if records is not None:
        threads.append(threading.Thread(target=write_input, daemon=True))
    for t in threads:
        t.start()
    finished = False
    try:
        for n, raw in enumerate(proc.stdout, 1):
            try:
                yield json.loads(raw)
            except ValueError as e:
                raise Ds4ReplayError(None, "output line %d is not JSON (%s): %r" % (n, e, raw[:200]), "", cmd)
        rc = proc.wait()
        for t in threads:
            t.join()
        finished = True
        if writer_error:
            raise writer_error[0]
        if rc != 0:
            raise Ds4ReplayError(rc, _error_message(list(tail)), "\n".join(tail), cmd)
    finally:
        if not finished:
            proc.kill()
            proc.wait()
            for t in threads:
                t.join(timeout=5)
        for f in (proc.stdout, proc.stderr):
            f.close()


def run_json(binary, args):
    """Runs ``binary args...`` to completion; returns its whole stdout parsed as one JSON value."""
    cmd = [binary] + [str(a) for a in args]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = proc.stderr.decode("utf-8", "replace").splitlines()
    if proc.returncode != 0:
        raise Ds4ReplayError(proc.returncode, _error_message(err), "\n".join(err[-200:]), cmd)
    return json.loads(proc.stdout)
