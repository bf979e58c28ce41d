"""``python -m fedpriv.ops.deploy``: the same commands as ``fedpriv deploy``."""

import signal
import sys

from .cli import deploy_main

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(deploy_main())
