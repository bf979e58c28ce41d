"""Paper studies outside the library core: private selection (selection/: synthetic scenarios,
the bandit, exact laws) and multi-task regression weights (multitask.py)."""
