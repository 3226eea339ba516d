"""One model of a launch: the option groups, each a noun (the job, the container, the hosts,
SSH, the SLURM request, the run, supervision, the console), each checking its own fields
once, at construction, in the words of the flag that set it.

A group's field is the one place an option is declared: its keyword (the field's name), its
flag, default, help and bounds (`declare.option`). The command line's click options
(cli/flags.py) and the Python API's keywords (`LaunchArgs` in options/keywords.py) are both
made from those fields, and a stage receives the group it uses.
"""
