"""Agents: roles bound to models, and the model families they load through."""

from agentcap.agents.agent import Agent, AgentConfig, Generation, MissingWeightsError, build_agent, tiny_agent
from agentcap.agents.tokenizer import build_word_tokenizer
from agentcap.agents.toy import ToyConfig, ToyMediaLM

__all__ = ["Agent", "AgentConfig", "Generation", "MissingWeightsError", "ToyConfig", "ToyMediaLM",
           "build_agent", "build_word_tokenizer", "tiny_agent"]
