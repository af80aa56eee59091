"""Generation backends: who samples an agent's actions.

``hf`` runs the agent's own model through HF ``generate`` (default, runs everywhere); ``vllm``
samples with a vLLM engine (optional extra) whose weights follow the learner through
:meth:`Backend.sync`. Both return, per observation, a :class:`~agentcap.agents.generation.Generation`
with the completion token ids and the log-probs the sampler drew them with; the agent then
recomputes the learner's log-probs itself, so the clipped objective's old policy is always the
learner's, and the sampler's log-probs serve the off-policy correction
(``agentcap.algorithms.offpolicy``). ``base`` holds the interface, ``build`` picks one.
"""
