"""`python -m h3director` is the command line tool."""

import sys

from h3director.cli import main

sys.exit(main())
