"""CPU numerics pins: what every CPU launch sets, and a variable the environment sets itself wins."""

from __future__ import annotations

from genconf.train import cpu_numerics


def test_cpu_pins_leave_what_the_environment_sets():
    assert cpu_numerics.pinned_env({}) == dict(cpu_numerics.CPU_PINS)
    chosen = {"ATEN_CPU_CAPABILITY": "default", "PATH": "/bin"}
    pins = cpu_numerics.pinned_env(chosen)
    assert "ATEN_CPU_CAPABILITY" not in pins and pins["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert cpu_numerics.effective_pins(chosen)["ATEN_CPU_CAPABILITY"] == "default"
    assert cpu_numerics.describe(cpu_numerics.effective_pins(chosen)).startswith("ATEN_CPU_CAPABILITY=default ")
