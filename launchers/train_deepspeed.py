"""Training entry point that torchrun starts for deepspeed plans: `train_deepspeed.py --artifacts DIR --run-dir RUN`.

`genconf launch DIR` (or the generated launch_deepspeed.sbatch) starts it on every rank.
"""

from genconf.train.runners.deepspeed import main

if __name__ == "__main__":
    raise SystemExit(main())
