"""`python -m dcu_serving.proxy` is `dcu-proxy`."""

import sys

from .cli import main

sys.exit(main())
