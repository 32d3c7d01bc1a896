"""parsearch: find the best parallel layout for training a transformer on a GPU cluster."""

__version__ = "0.1.0"
