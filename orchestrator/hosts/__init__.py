"""Hosts: the hostfile read into a `Cluster` (every format users bring), and the hosts and
slots chosen out of it (--include/--exclude, --num-nodes, --num-gpus). Pure.

hostfile.py   hostfiles: one parser for every format users bring, producing a `Cluster`
selection.py  choosing hosts and slots out of a hostfile, as DeepSpeed's launcher does. Pure
"""
