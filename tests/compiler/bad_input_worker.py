"""Subprocess for test_bad_inputs.py: runs ``qfuse`` command lines one after another.

    python -m tests.compiler.bad_input_worker

Reads one JSON list (the argv after ``qfuse``) per line on stdin. For each it runs
``qfuse.compiler.cli.main(argv)`` with file descriptors 1 and 2 sent to temporary files (so
native libraries' output counts too) and answers one JSON line on the original stdout:
``{"code": exit code, "stdout": ..., "stderr": ...}``. Importing qfuse once for all cases keeps
the campaign fast; the test process owns the timeout: it kills this process when a case hangs
or starts a new one when a case crashes it.

The address space is limited (RLIMIT_AS, QFUSE_WORKER_MAX_GIB, default 8) so that a case which
does allocate an absurd size fails quickly here instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile


def _limit_memory() -> None:
    gib = float(os.environ.get("QFUSE_WORKER_MAX_GIB", "8"))
    limit = int(gib * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _run(argv: list[str], cwd: str) -> dict[str, object]:
    from qfuse.compiler.cli import main

    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        here = os.getcwd()
        try:
            os.chdir(cwd)
            code: int = main(argv)
        except SystemExit as exc:  # argparse: usage (2), --help / --version (0)
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - escaped main(): the test reports it
            import traceback

            traceback.print_exc()
            code = -1000 if not isinstance(exc, MemoryError) else -1001
        finally:
            sys.stdout.flush()
            if not sys.stderr.closed:
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            os.chdir(here)
        if sys.stderr.closed:  # main() closes it on a broken pipe
            sys.stderr = os.fdopen(2, "w", closefd=False)
        out.seek(0)
        err.seek(0)
        return {"code": code, "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


def main() -> None:
    _limit_memory()
    import qfuse.compiler.cli  # noqa: F401 - import once, before the first case's clock starts

    answers = os.fdopen(os.dup(1), "w")
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        result = _run(request["argv"], request["cwd"])
        print(json.dumps(result), file=answers, flush=True)


if __name__ == "__main__":
    main()
