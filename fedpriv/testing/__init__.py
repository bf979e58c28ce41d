"""Test scaffolding shipped with the package: an in-process Flower Grid (local_grid.py) and
fault injection for ClientApps (chaos.py)."""
