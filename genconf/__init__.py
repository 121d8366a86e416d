"""genconf: from "this model on this cluster" to a training run that works the first time."""

__version__ = "0.1.0"
