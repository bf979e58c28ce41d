"""Small helpers every layer may use: atomic writes, labelled public draws, thread counts."""
