"""The public home of :func:`check_env`: ``from agentcap.testing import check_env`` (it lives in
``agentcap.core.check``)."""

from agentcap.core.check import check_env

__all__ = ["check_env"]
