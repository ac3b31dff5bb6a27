import sys

from ragrl.cli import main

sys.exit(main())
