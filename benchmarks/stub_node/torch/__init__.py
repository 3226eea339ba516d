"""A stand-in for torch on the scale harness's nodes (benchmarks/scale_harness.py): only
torch.distributed.run, as the node script runs it. Nothing else of torch is here."""
