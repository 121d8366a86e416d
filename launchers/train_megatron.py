"""Training entry point that torchrun starts for megatron plans: `train_megatron.py --artifacts DIR --run-dir RUN`.

`genconf launch DIR` (or the generated launch_megatron.sbatch) starts it on every rank.
"""

from genconf.train.runners.megatron import main

if __name__ == "__main__":
    raise SystemExit(main())
