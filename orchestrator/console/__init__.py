"""What a person reads: the log stream into console and files (sink.py), folding of lines
many ranks print alike (fold.py), the footer and start progress, `top`'s table of ranks
(rank_table.py) and `plot`'s picture.

footer.py            the footer of `launch` on a terminal
plot.py              A run's metrics as one picture
progress.py          how far a start got, while nodes connect, are probed and start their part
reading.py           reading logs back, for `orchestrator logs` and a run's summary
torchrun_reports.py  torchrun's own reports of failures it did not cause
"""
