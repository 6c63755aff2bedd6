"""Command lines run by their own `main` in the test process, as finished processes (`returncode`, `stdout`,
`stderr`): `adaptguard ARGS`, plain `lm_eval ARGS` and `python SCRIPT ARGS`. A subprocess would import torch,
transformers and peft anew (7-9 s of CPU each, most of the suite's subprocess time); the process itself is tested where
it matters (the console script in test_cli_help, a fresh plain `lm_eval` in test_compat_tasks)."""

from __future__ import annotations

import contextlib
import io
import logging
import subprocess
import sys
import warnings


def run_in_process(main, argv: list[str], cwd=None) -> subprocess.CompletedProcess:
    """`main()` run in the folder `cwd` with `sys.argv` = `argv`, as that process would run it. What the process would
    print is captured as it would show: warnings under Python's default filters (pytest would otherwise record them
    out of sight), the log lines of handlers bound to the real stderr, and those logging's last resort prints. A crash
    raises here rather than printing a traceback; an argparse refusal exits 2 as it does, `sys.exit("message")` 1."""
    out, err = io.StringIO(), io.StringIO()
    handlers = [h for h in _stream_handlers() if h.stream in (sys.__stderr__, sys.stderr)]
    streams = [h.setStream(err) for h in handlers]
    root = logging.getLogger()
    # A fresh process has no handler on the root logger, so a warning of a logger without one (adaptguard's own) goes
    # to stderr by logging's last resort; pytest's capturing handlers there would take it out of sight.
    root_handlers, root.handlers = root.handlers, []
    saved_argv, sys.argv = sys.argv, argv
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
                code = exit_.code
                if not isinstance(code, int | None):
                    print(code, file=err)  # as Python prints sys.exit("message")
                    code = 1
    finally:
        sys.argv = saved_argv
        root.handlers = root_handlers
        for handler, stream in zip(handlers, streams):
            handler.setStream(stream)
        for handler in _stream_handlers():  # made during the run (lm-eval's, at its first run): the real stderr, so
            if handler.stream is err:       # the next run captures them too
                handler.setStream(sys.stderr)
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())


def _stream_handlers() -> list[logging.StreamHandler]:
    """The stream handlers of every logger (logging's last resort is none of them)."""
    return [h for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
            for h in getattr(logger, "handlers", []) if isinstance(h, logging.StreamHandler) and "stream" in vars(h)]


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """`adaptguard ARGS`, run by the CLI's own `main` (what the console script and `python -m adaptguard.cli` call)."""
    from adaptguard.cli.main import main

    argv = ["adaptguard", *map(str, args)]
    return run_in_process(lambda: main(argv[1:]), argv, cwd)


def run_lm_eval_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """Plain `lm_eval ARGS`, run by lm-eval's own entry point (`lm_eval.__main__.cli_evaluate`, what `python -m lm_eval`
    and the `lm_eval` console script call)."""
    from lm_eval.__main__ import cli_evaluate

    return run_in_process(cli_evaluate, ["lm_eval", *map(str, args)], cwd)


def run_script(path, *args, cwd=None) -> subprocess.CompletedProcess:
    """`python PATH ARGS` (an example or benchmark script), run as `__main__` by `runpy`."""
    import runpy

    def main() -> None:  # (run_path returns the script's globals, not an exit code)
        runpy.run_path(str(path), run_name="__main__")

    return run_in_process(main, [str(path), *map(str, args)], cwd)
