"""Acting on runs from any shell or program: stopping a run (stop.py), taking every
rank's stacks (rank_stacks.py)."""
