"""Hosts: the hostfile read into a `Cluster` (every format users bring), and the hosts and
slots chosen out of it (--include/--exclude, --num-nodes, --num-gpus). Pure."""
