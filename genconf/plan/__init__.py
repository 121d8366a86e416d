"""The pure core: specs, counting, pipeline schedules, precision recipes, memory, cost, the rule book, the search
and the plan.json codec. Standard library and genconf.plan only (tests/test_architecture.py holds it to that)."""
