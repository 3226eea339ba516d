"""Planning, pure (no network): the job spec (spec.py), hosts + spec + what the probe found ->
a `LaunchPlan` (launch_plan.py), and the plan rendered as one bash script per node
(scripts.py). `render` and `launch --dry-run` stop here.

container.py  A job in a container image
deadline.py   A run's deadline
"""
