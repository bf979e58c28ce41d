"""Experiment configs, the resumable runner, and plots (``fedpriv experiment``)."""
