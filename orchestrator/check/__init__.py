"""`orchestrator check`: prove a cluster is ready.

run.py drives the three steps; gather.py gathers per-node facts and the rendezvous test (with
reach.py, shipped to the nodes); collectives.py is the job every rank runs; measure.py holds
the exact expected values and the bandwidth formulas; diagnose.py says what is wrong with
the nodes, and report.py turns it all into problems and tables.
Only collectives.py imports torch, and only when a rank runs it.

facts.py    what `orchestrator check` found on each node, as facts
inputs.py   what `orchestrator check` is asked to do
results.py  `orchestrator check`: what it found
"""
