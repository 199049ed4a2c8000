import sys

from labkit.app.cli import main

sys.exit(main())
