"""Training entry point that torchrun starts for fsdp plans: `train_fsdp.py --artifacts DIR --run-dir RUN`.

`genconf launch DIR` (or the generated launch_fsdp.sbatch) starts it on every rank.
"""

from genconf.train.runners.fsdp import main

if __name__ == "__main__":
    raise SystemExit(main())
