"""YAML in, specs out: the model catalog, GPUs and their calibration, cluster presets, recipes, and Hugging Face
config.json import. Imports only genconf.plan (and yaml)."""
