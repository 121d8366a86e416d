"""Artifact builders, one module per artifact (megatron, deepspeed, olmo, slurm, readme), each from the one plan;
templates holds the jinja2 environment and the quoting filters, files renders them all."""
