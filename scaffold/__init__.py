"""scaffold: generate explicit, plain-PyTorch training projects from templates."""

__version__ = "0.1.0"
