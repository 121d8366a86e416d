"""Training entry point that torchrun starts for megatron plans: `train_megatron.py --artifacts DIR --run-dir RUN`.

`genconf launch DIR` (or the generated launch_megatron.sbatch) starts it on every rank.
"""

from genconf.train import preempt

preempt.install()  # first: Slurm's SIGUSR1 may come while torch is still importing

from genconf.train import loop  # noqa: E402
from genconf.train.runners.megatron import main  # noqa: E402

if __name__ == "__main__":
    loop.exit_process(main())
