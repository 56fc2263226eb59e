"""bendc's version (nothing imports the package root for it)."""
__version__ = "0.1.0"
