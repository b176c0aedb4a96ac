from raylet_sim.cli import entry

entry()
