"""`python -m nopstream`: the command line."""

import sys

from nopstream.cli import main

sys.exit(main())
