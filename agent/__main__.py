import sys

from agent.ops.cli import main

sys.exit(main())
