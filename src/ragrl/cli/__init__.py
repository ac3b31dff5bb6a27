"""The `ragrl` command line: one sub-command per workflow stage.

Every Snakemake rule calls exactly one of these, so the command in a rule's log can be re-run by
hand. This package only parses arguments and calls stage functions; it holds no logic of its own.
Each command group registers its sub-commands in its own module (data, retrieval, kg, agent, harr,
results, models); this module builds the parser from them and runs a command.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import sys
import traceback

from ragrl.cli import agent, data, harr, kg, models, results, retrieval
from ragrl.errors import RagrlError
from ragrl.jobenv import with_log_defaults

# In the order `ragrl --help` has always listed the commands (retrieval's checks after the KG's).
_GROUPS = (data.register, retrieval.register_indexes, kg.register, retrieval.register_checks, agent.register,
           harr.register, results.register, models.register)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragrl", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of a user error too (or set RAGRL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in _GROUPS:
        register(sub)
    return parser


def _quiet_library_progress_bars() -> None:
    os.environ.update(with_log_defaults(dict(os.environ), sys.stderr.isatty()))


def _end_logs_with_newline() -> None:
    """A job log (`> log 2>&1`) ends with a newline whatever wrote to it last: a progress bar
    closed with a carriage return at exit, or a library message without one, would otherwise
    leave the last line unterminated (tail, grep and the next appended run all suffer)."""
    import stat

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            # The descriptor is usually write-only; read the file through its /proc link (Linux).
            with open(f"/proc/self/fd/{fd}", "rb") as fh:
                if fh.seek(0, os.SEEK_END) == 0:
                    continue
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    os.write(fd, b"\n")
        except OSError:
            continue


def is_user_error(exc: BaseException) -> bool:
    """Failures the user fixes (ragrl.errors.RagrlError: bad input or config, a busy work
    directory, an endpoint that answered nothing usable), and a missing input file, which the
    message names in full. Everything else, ImportError included, is a bug or a broken
    environment, whose traceback is the report: a missing package shows which import pulled it
    in, and the deliberate optional-dependency checks raise InputError naming the setting."""
    return isinstance(exc, (RagrlError, FileNotFoundError))


def _debug_env() -> bool:
    # An environment variable, so a Snakemake job can be re-run with tracebacks without editing its rule.
    return os.environ.get("RAGRL_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    # Registered first, so it runs after the exit handlers libraries register while the command runs.
    atexit.register(_end_logs_with_newline)
    _quiet_library_progress_bars()
    # The first log line is the command itself, so a log is enough to re-run a job by hand
    # (stderr for `query`, whose stdout is data a user may pipe).
    echo = sys.stderr if args.command == "query" else sys.stdout
    print("$ ragrl " + " ".join(shlex.quote(a) for a in argv), file=echo, flush=True)
    try:
        args.func(args)
    except Exception as exc:
        if not is_user_error(exc):
            raise
        if args.debug or _debug_env():
            traceback.print_exc()
        print(f"ragrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0
