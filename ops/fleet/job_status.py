"""The rules a job's spec sets for its exits and progress, as the watcher judges them (the
status file itself is contract.status)."""

from __future__ import annotations

from dataclasses import dataclass

from contract.exit_codes import EXIT_BAD_INPUT, EXIT_PREEMPTED


@dataclass(frozen=True)
class JobRules:
    """What the job's spec (contract.job.JobSpec) says about its exits and progress."""

    steps: int | None = None  # the done rule: the last progress reached it
    preempted: frozenset[int] = frozenset({EXIT_PREEMPTED})
    fatal: frozenset[int] = frozenset({EXIT_BAD_INPUT})
    reports_progress: bool = True  # `progress: none`: judged by process liveness alone
    native_stacks: bool = False  # `hang_stacks: native`: a hang's forensics read native frames

    @classmethod
    def of(cls, spec) -> JobRules:
        return cls(
            steps=spec.steps,
            preempted=frozenset(spec.exit_codes.preempted),
            fatal=frozenset(spec.exit_codes.fatal),
            reports_progress=spec.progress != "none",
            native_stacks=spec.hang_stacks == "native",
        )
