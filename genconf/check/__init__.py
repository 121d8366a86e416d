"""`genconf check DIR`: re-validate an artifacts directory (perhaps edited by hand) and name the offending line.

Each file is parsed the way its tool parses it (JSON, YAML, Megatron-LM's `--flag value`, sbatch's #SBATCH
lines) and held against plan.json and the one rule book (`genconf.plan.rules`): the Megatron arguments are turned
back into a ParallelPlan and run through `rules.check`, so `--pipeline-model-parallel-size 3` on an 80-layer
model is refused here even though megatron-core's TransformerConfig accepts it. The only subprocess is the
optional `sbatch --test-only` (`--slurm`).

One module per file format (plan, deepspeed, megatron, olmo, slurm) and `directory`, which walks a directory.
"""
