import sys

from raylet_sim.cli import main

sys.exit(main())
