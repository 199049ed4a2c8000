import sys

from labkit.workbench.cli import main

sys.exit(main())
