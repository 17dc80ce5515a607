"""The package version, alone in a module so that reading it imports nothing else."""

__version__ = "0.1.0"
