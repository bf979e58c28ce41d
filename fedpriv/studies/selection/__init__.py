"""Private selection with heterogeneous sensitivities (Antonova et al. 2025)."""
