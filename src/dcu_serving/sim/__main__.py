"""`python -m dcu_serving.sim serve MODEL_PATH ...`"""

import sys

from dcu_serving.sim.cli import main

sys.exit(main())
