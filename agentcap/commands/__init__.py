"""One module per ``agentcap <command>`` outside LightningCLI's fit / validate / test / predict:
caption, evaluate, export, plan, envs (listed in ``agentcap.cli.COMMANDS``)."""
