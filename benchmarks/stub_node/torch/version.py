__version__ = "2.13.0+harness"
