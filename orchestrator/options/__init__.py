"""One model of a launch: the option groups, each a noun (the job, the container, the hosts,
SSH, the SLURM request, the run, supervision, the console), each checking its own fields
once, at construction, in the words of the flag that set it.

A group's field is the one place an option is declared: its keyword (the field's name), its
flag, default, help and bounds (`declare.option`). The command line's click options
(cli/flags.py) and the Python API's keywords (`LaunchArgs` in options/keywords.py) are both
made from those fields, and a stage receives the group it uses.

backend_facts.py  the launch backends by name, and the facts the stages below the API need
checking.py     the check group
choosing.py     the hosts group
declare.py      how an option is declared once
display.py      the console group: how the run's stream looks on this terminal (launch, exec)
image.py        the container group: --container IMAGE and how it runs (launch, render, check)
keywords.py     A launch's options: the groups together, and the flat keywords of the Python API
reaching.py     the SSH group
running.py      the run group
scheduler.py    the SLURM group: what the job asks of SLURM (launch, render with --backend slurm)
supervision.py  the supervision group
workload.py     the job group
"""
