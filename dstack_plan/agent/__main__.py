"""`python -m dstack_plan.agent serve|start|stop|status ...`."""

import sys

from dstack_plan.agent.main import main

sys.exit(main())
