"""python -m dcu_serving.doctor: dcu-doctor where its console script is not installed."""

import sys

from dcu_serving.doctor.cli import main

sys.exit(main())
