from fake_vllm import LoRARequest  # noqa: F401
