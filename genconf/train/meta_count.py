"""Count the parameters megatron-core builds for catalog models, on the meta device (no memory, no GPU).

    python -m genconf.train.meta_count llama3-8b mixtral-8x7b --json

Builds GPTModel exactly as the megatron launcher configures it (TP=1, PP=1, local layer spec) under
`torch.device("meta")` and returns sum(p.numel()) next to the planner's count for that rank.
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def count(names: list[str]) -> dict[str, dict]:
    import torch

    from genconf.catalog.models import resolve_model
    from genconf.plan import memory
    from genconf.plan.counting import exact_param_count
    from genconf.plan.runconfig import RunConfig
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.train import mcore_compat
    from genconf.train.runners.megatron import gpt_model, transformer_config, transformer_config_kwargs
    from genconf.train.runtime import init_distributed

    compat = mcore_compat.install()
    try:
        from megatron.core import parallel_state as ps

        os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 1000))
        init_distributed()
        ps.initialize_model_parallel()
        mcore_compat.model_parallel_manual_seed(1)
        out = {}
        for name in names:
            model, _ = resolve_model(name)
            plan = ParallelPlan(framework="megatron", dp=1, mbs=1, gbs=1, seq_length=model.seq_length,
                                layer_spec="local")
            cfg = RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=1), num_gpus=1, data={},
                            precision_recipe="bf16", prediction={}, shrink={}, artifacts="")
            kwargs = dict(transformer_config_kwargs(cfg, cpu=True), perform_initialization=False)
            with torch.device("meta"):
                gpt = gpt_model(cfg, transformer_config(kwargs), use_te=False)
            out[model.name] = {"built": sum(p.numel() for p in gpt.parameters()),
                               "planned": memory.rank_params(model, plan, 0).total,
                               "checkpoint": exact_param_count(model)}
            del gpt
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        return out
    finally:
        compat.uninstall()


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    args = sys.argv[1:] if argv is None else argv
    names = [a for a in args if a != "--json"]
    result = count(names)
    if "--json" in args:
        print(json.dumps(result))
    else:
        for name, r in result.items():
            print(f"{name:<18} built {r['built']:>16,}  planned {r['planned']:>16,}  checkpoint {r['checkpoint']:>16,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
