"""The imperative shell: writing artifacts directories atomically, launching (torchrun, Slurm), verifying runs,
recipe CI and plots."""
