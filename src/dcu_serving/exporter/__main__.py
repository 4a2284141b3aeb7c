import sys

from dcu_serving.exporter.cli import main

sys.exit(main())
