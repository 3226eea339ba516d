"""Each rank prints `rank R count I` for I = 0 .. COUNT-1, one every EVERY seconds, then
exits 0: a log whose every line can be checked for loss and doubles."""

import os
import time

rank = int(os.environ["RANK"])
count, every = int(os.environ.get("COUNT", "300")), float(os.environ.get("EVERY", "0.05"))
for i in range(count):
    print(f"rank {rank} count {i}", flush=True)
    time.sleep(every)
