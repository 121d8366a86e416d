"""One Runner per framework (genconf.train.loop.Runner): build the model and optimizer the plan describes, run one
optimizer step, save and load checkpoints in the framework's own format."""
