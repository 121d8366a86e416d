"""Portable CPU numerics: what a CPU run pins so that its loss curve does not depend on the instruction set.

A CPU smoke run is deterministic on one machine, but ATen, oneDNN and MKL pick their kernels from the CPU's
instruction set (AVX-512, AMX, AVX2, ...), and kernels of different vector widths sum in different orders: the
same run differed by 5e-5 between AVX-512 and AVX2 machines (issue 10), more where BF16 GEMMs go through AMX.
So CPU runs compute in FP32 (recipes' smoke variants) and pin every ISA dispatch to AVX2, the widest set that
every x86-64 machine of the last decade (Intel since Haswell, AMD since Excavator) has. A value already in the
environment wins: a user (or the capability test) can choose another setting on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping

CPU_PINS: tuple[tuple[str, str], ...] = (
    ("ATEN_CPU_CAPABILITY", "avx2"),  # ATen's vectorised kernels (reductions, softmax, norms): AVX2 build
    ("ONEDNN_MAX_CPU_ISA", "AVX2"),  # oneDNN matmul/attention packing: no AVX-512 or AMX code paths
    ("MKL_CBWR", "COMPATIBLE"),  # MKL's conditional numerical reproducibility: one code path on every x86 CPU
    ("MKL_NUM_THREADS", "1"),  # one thread: a fixed reduction order inside BLAS
    ("OMP_NUM_THREADS", "1"),  # likewise for ATen's OpenMP loops
    ("GENCONF_THREADS", "1"),  # torch.set_num_threads in the runners (genconf.train.runtime)
)
"""(variable, value) pinned for every CPU launch unless the environment already sets the variable."""


def pinned_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The CPU pins to add to `environ` for a launch: only the variables it does not already set."""
    return {name: value for name, value in CPU_PINS if name not in environ}


def effective_pins(environ: Mapping[str, str]) -> dict[str, str]:
    """Each pinned variable's value as a run sees it (the pin, or what the environment chose instead)."""
    return {name: environ.get(name, value) for name, value in CPU_PINS}


def describe(pins: Mapping[str, str]) -> str:
    """`A=x B=y` in CPU_PINS order, for golden-file headers and logs."""
    return " ".join(f"{name}={pins[name]}" for name, _ in CPU_PINS if name in pins)
