"""How long a test waits for an event it then asserts on.

``RUN_END_S``: the limit for ``executor.wait(handle, ...)`` calls whose result is a terminal state the test
asserts. The wait returns at the event, so the limit costs nothing when things work; it is a safety net for
a stuck run, not a speed assumption. 300 s is 3-4x the slowest such run on a 2-core box with a busy core
(60-120 s limits broke a busy run in session 5; docs/lab-notes/test-suite-runs.md, sixth series).
"""

RUN_END_S = 300.0
