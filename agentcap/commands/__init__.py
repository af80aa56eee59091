"""One module per ``agentcap <command>`` outside LightningCLI's fit / validate / test / predict:
caption, evaluate, export, plan, envs, data (listed in ``agentcap.commands.menu.COMMANDS``)."""
