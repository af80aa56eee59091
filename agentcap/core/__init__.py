"""What a task implements: the environment base, its records and spaces, manifests, the checks a
new environment must pass (``check_env``), and the schedule of stages every layer above reads."""
