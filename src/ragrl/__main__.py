import sys

from ragrl.forkserver import run_via_server

# With RAGRL_FORKSERVER set, a pre-imported server runs the command (ragrl/forkserver.py);
# otherwise, or when it declines, this process does.
code = run_via_server(sys.argv[1:])
if code is None:
    from ragrl.cli import main

    code = main()
sys.exit(code)
