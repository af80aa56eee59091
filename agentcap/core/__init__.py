"""What a task implements: the environment base, its records and spaces, manifests, and the checks a
new environment must pass (``check_env``)."""
