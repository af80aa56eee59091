"""Worlds built from real recordings (beside the synthetic ones in ``agentcap_envs.toy``):
``speech`` mixes Debian's Asterisk voice prompts with real desktop sound effects for AudioMap and
ACE-Cap; ``assets`` locates the unpacked Debian packages. Nothing heavy is imported here."""
