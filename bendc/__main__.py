import sys

from bendc.cli import main

sys.exit(main())
