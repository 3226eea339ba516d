"""Launching a job: options and preflight, the node pool (spares and recovery), starting in
the background (--detach), and the launcher, where the stages of one attempt meet."""
