import sys

from dcu_serving.bundle.cli import main

sys.exit(main())
