import sys

from agent.launcher.main import main

sys.exit(main())
