"""ragrl: one reproducible workflow for R1-style RL methods for retrieval-augmented generation."""

__version__ = "0.1.0"
