"""nmt: the original Transformer for machine translation, end to end, small and exact."""

__version__ = "0.1.0"
