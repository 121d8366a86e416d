"""The one exception type users see: a mistake in their input, printed as one line, exit code 2."""


class GenconfError(Exception):
    """Bad input or an impossible request. The message is one line: what was wrong, the values, the fix."""


class NoFeasiblePlan(GenconfError):
    """The search found no layout that satisfies every rule and fits in memory. `result`: that search (its rejection
    counts and nearest misses, for --explain)."""

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result
