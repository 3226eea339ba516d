"""Acting on runs from any shell or program: stopping a run (stop.py)."""
