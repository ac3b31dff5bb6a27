"""Environment defaults of a job whose stderr is a log file, not a terminal (standard library only).

transformers and the hub draw tqdm bars with carriage returns; in a log file they are noise. The
CLI applies these before a command runs, and the fork server before it imports the libraries that
read them, so that its jobs and fresh processes see the same.
"""

from __future__ import annotations

LOG_FILE_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def with_log_defaults(env: dict[str, str], stderr_is_tty: bool) -> dict[str, str]:
    """`env` as the CLI leaves it: the defaults added where stderr is not a terminal."""
    return env if stderr_is_tty else {**LOG_FILE_ENV, **env}
