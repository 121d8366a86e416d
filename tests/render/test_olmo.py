"""olmo_fsdp.yaml against the seed's OLMo configs: FSDP and DDP strategies, hybrid sharding, wrapping."""

from __future__ import annotations

from genconf.render.olmo import FSDP_WRAPPING


def test_olmo_config_matches_the_seed_shapes(rendered):
    import yaml

    fsdp = yaml.safe_load((rendered["fsdp1b"] / "olmo_fsdp.yaml").read_text())
    assert fsdp["distributed_strategy"] == "fsdp" and fsdp["fsdp"]["sharding_strategy"] == "FULL_SHARD"
    assert fsdp["fsdp"]["precision"] == "mixed" and fsdp["model"]["d_model"] == 2048 and fsdp["model"]["n_layers"] == 16
    assert fsdp["fsdp"]["wrapping_strategy"] in FSDP_WRAPPING
    ddp = yaml.safe_load((rendered["ddp1b"] / "olmo_fsdp.yaml").read_text())
    assert ddp["distributed_strategy"] == "ddp" and ddp["ddp"] == {"grad_sync_mode": "batch", "find_unused_params": False}
    assert ddp["fsdp"]["sharding_strategy"] == "NO_SHARD"
    hsdp = yaml.safe_load((rendered["hsdp7b"] / "olmo_fsdp.yaml").read_text())
    assert hsdp["fsdp"]["sharding_strategy"] == "HYBRID_SHARD" and hsdp["fsdp"]["hybrid_sharding_num_model_replicas"] == 4
    # the seed's 7B: by_block (the embedding is smaller than one block)
    assert hsdp["fsdp"]["wrapping_strategy"] == "by_block" and hsdp["model"]["d_model"] == 4096
