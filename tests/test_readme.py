"""The README's test command is what CI runs: .ci/run runs it verbatim, so the two never drift apart; and what the
README shows genconf printing is what it prints."""

from conftest import REPO, run_genconf


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPO / "README.md").read_text().splitlines()
    commands = [line for line in readme if line.startswith("python3 -m venv .venv && ") and "pytest" in line]
    assert len(commands) == 1, commands
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[0]
    # the readers the tests need are in it: the extra, ai2-olmo without its numpy<2 pin, and the pictures
    assert "'.[train,test,plot,readers,fp8]'" in ci[-1] and "--no-deps ai2-olmo==0.6.0" in ci[-1]
    assert ci[-1].endswith("genconf ci --plot ci-plots")


def _readme_block(after: str) -> str:
    """The first fenced block after the line `after`."""
    text = (REPO / "README.md").read_text()
    return text.split(after, 1)[1].split("```", 2)[1].removeprefix("\n")


def test_the_main_job_prints_what_the_readme_shows():
    out = run_genconf("--model", "70b", "--gpus", "384")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == _readme_block("## What the main job prints").strip()


def test_the_plan_that_cannot_fit_says_what_the_readme_shows():
    out = run_genconf("--model", "llama3.1-405b", "--gpus", "8")
    shown = _readme_block("line saying why and what would make it fit:").split("\n", 1)
    assert shown[0] == "$ genconf --model llama3.1-405b --gpus 8"
    assert out.returncode == 2 and " ".join(out.stderr.split()) == " ".join(shown[1].split())
