"""Training entry point that torchrun starts for deepspeed plans: `train_deepspeed.py --artifacts DIR --run-dir RUN`.

`genconf launch DIR` (or the generated launch_deepspeed.sbatch) starts it on every rank.
"""

from genconf.train import preempt

preempt.install()  # first: Slurm's SIGUSR1 may come while torch is still importing

from genconf.train import loop  # noqa: E402
from genconf.train.runners.deepspeed import main  # noqa: E402

if __name__ == "__main__":
    loop.exit_process(main())
