"""`python -m studies.cli`: the `sharpscale` command without its console script."""

import sys

from studies.cli import main

sys.exit(main())
