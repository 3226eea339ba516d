"""What a person reads: the log stream into console and files (sink.py), folding of lines
many ranks print alike (fold.py), the footer and start progress, `top`'s table of ranks
(rank_table.py) and `plot`'s picture."""
