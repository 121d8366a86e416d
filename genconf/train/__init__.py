"""Training runtime: the launchers started by torchrun (needs the train extra: torch, deepspeed, megatron-core)."""
