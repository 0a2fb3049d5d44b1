"""What a job's exit code means by default (a job's `exit_codes` in tpupod-job.yaml may name
others): the built-in trainer exits with these, `tpupod_job` with EXIT_PREEMPTED, and the
watcher judges by them. Defined once for Python; the worker-side files that cannot import
contract (bootstrap/jobkit/tpupod_job, a job's own copy) keep the literal 75, which
tests/contract/test_exit_codes.py checks against this one."""

from __future__ import annotations

EXIT_DONE = 0
EXIT_FAILED = 1  # a crash: restarted, charged to max_restarts
EXIT_BAD_INPUT = 2  # config, data or tokenizer wrong: restarting cannot help (fatal)
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the preemption checkpoint is committed; restart to resume
