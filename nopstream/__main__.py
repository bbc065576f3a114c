"""`python -m nopstream` and the `nopstream` console script: the command line."""

import gc
import sys

gc.disable()  # while the command's modules load (`nopstream.cli.startup`)

from nopstream.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
