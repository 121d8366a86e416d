"""The README's test command is what CI runs: .ci/run runs it verbatim, so the two never drift apart."""

from conftest import REPO


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPO / "README.md").read_text().splitlines()
    commands = [line for line in readme if line.startswith("python3 -m venv .venv && ") and "pytest" in line]
    assert len(commands) == 1, commands
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[0]
    # the readers the tests need are in it: the extra, ai2-olmo without its numpy<2 pin, and the pictures
    assert "'.[train,test,plot,readers,fp8]'" in ci[-1] and "--no-deps ai2-olmo==0.6.0" in ci[-1]
    assert ci[-1].endswith("genconf ci --plot ci-plots")
