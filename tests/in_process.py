"""Command lines run by their own `main` in the test process, as finished processes (`returncode`, `stdout`,
`stderr`): `adaptguard ARGS` and plain `lm_eval ARGS`. A subprocess would import torch, transformers and peft anew
(7-9 s of CPU each, most of the suite's subprocess time); the process itself is tested where it matters (the
console script in test_cli_help, a fresh plain `lm_eval` in test_compat_tasks)."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
import warnings


def run_in_process(main, shown: list[str], cwd=None) -> subprocess.CompletedProcess:
    """`main()` run in the folder `cwd` as the process `shown` would run. What the process would print is captured as
    it would show: warnings under Python's default filters (pytest would otherwise record them out of sight), the
    log lines of handlers bound to the real stderr, and those logging's last resort prints. A crash raises here
    rather than printing a traceback; an argparse refusal exits 2 as it does, `sys.exit("message")` 1."""
    out, err = io.StringIO(), io.StringIO()
    handlers = [h for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
                for h in getattr(logger, "handlers", []) if isinstance(h, logging.StreamHandler)
                and "stream" in vars(h) and h.stream in (sys.__stderr__, sys.stderr)]  # (logging's last resort: no)
    streams = [h.setStream(err) for h in handlers]
    root = logging.getLogger()
    # A fresh process has no handler on the root logger, so a warning of a logger without one (adaptguard's own) goes
    # to stderr by logging's last resort; pytest's capturing handlers there would take it out of sight.
    root_handlers, root.handlers = root.handlers, []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                contextlib.chdir(cwd or "."), warnings.catch_warnings():
            def show(message, category, filename, lineno, file=None, line=None):  # when warned, in order, as Python
                err.write(warnings.formatwarning(message, category, filename, lineno, line))

            warnings.showwarning = show
            warnings.resetwarnings()  # Python's own default filters, as a fresh process has them
            warnings.simplefilter("default")
            for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
                warnings.simplefilter("ignore", category)  # each goes first: the list ends as Python's does
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            try:
                code = main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int | None) else 1
                if not isinstance(exit_.code, int | None):
                    print(exit_.code, file=err)  # as Python prints sys.exit("message")
    finally:
        root.handlers = root_handlers
        for handler, stream in zip(handlers, streams):
            handler.setStream(stream)
    return subprocess.CompletedProcess(shown, code or 0, out.getvalue(), err.getvalue())


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """`adaptguard ARGS`, run by the CLI's own `main` (what the console script and `python -m adaptguard.cli` call)."""
    from adaptguard.cli.main import main

    argv = [str(a) for a in args]
    return run_in_process(lambda: main(argv), ["adaptguard", *argv], cwd)


def run_lm_eval_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """Plain `lm_eval ARGS`, run by lm-eval's own entry point (`lm_eval.__main__.cli_evaluate`, what `python -m lm_eval`
    and the `lm_eval` console script call), with `sys.argv` as that process would have it."""
    from lm_eval.__main__ import cli_evaluate

    argv = ["lm_eval", *map(str, args)]

    def main():
        saved, sys.argv = sys.argv, argv
        try:
            return cli_evaluate()
        finally:
            sys.argv = saved

    return run_in_process(main, argv, cwd)


def run_script(path, *args, cwd=None) -> subprocess.CompletedProcess:
    """`python PATH ARGS` (an example script), run as `__main__` by `runpy` with `sys.argv` as that process would have
    it."""
    import runpy

    argv = [str(path), *map(str, args)]

    def main():
        saved, sys.argv = sys.argv, argv
        try:
            runpy.run_path(str(path), run_name="__main__")
        finally:
            sys.argv = saved

    return run_in_process(main, ["python", *argv], cwd)
