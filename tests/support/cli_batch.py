"""Several ``python -m nbhw`` command lines through one process: ``python tests/support/cli_batch.py ARGVS_JSON``.

Each line goes through the process entry (:func:`nbhw.__main__.cli`, what ``python -m nbhw`` runs) with its own
``sys.argv``, stdout and stderr; its exit code is the one ``sys.exit`` was given. One JSON list on stdout: per line,
``{"argv", "code", "out", "err", "threads"}`` (the nbhw threads alive after it). The interpreter's start (and torch's
import, where a line reaches it) is paid once for all the lines.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
from typing import Any


def run(argv: list[str]) -> dict[str, Any]:
    from nbhw.__main__ import cli

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["nbhw", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli()
        code: Any = "returned without sys.exit"
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.argv = saved
    threads = sorted(t.name for t in threading.enumerate() if t.name.startswith("nbhw") and t.is_alive())
    return {"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(), "threads": threads}


def main() -> None:
    results = [run(argv) for argv in json.loads(sys.argv[1])]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
