"""The `standby:` key of `tpupod-job.yaml` (contract.job.JobSpec): what a worker's pre-imported
next attempt imports, and the hook that sets its start-up environment. Which run lines may have
one is contract.runline's (stdlib, for the launcher); this is the operator side's check."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from contract.runline import MODULE


class StandbySpec(BaseModel):
    """A pre-imported next attempt on every worker (docs/proposals/standby-interpreter.md): an
    interpreter of the job's environment that has imported `preload` while the job runs, so a
    restart on the same VMs skips the imports. `prepare` ("module:function") returns the
    variables the interpreter must start with (the built-in trainer's allocator), or None."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preload: tuple[str, ...] = ()
    prepare: str | None = None

    @field_validator("preload", mode="before")
    @classmethod
    def _modules(cls, value: Any) -> Any:
        names = [value] if isinstance(value, str) else list(value or ())
        for name in names:
            if not isinstance(name, str) or not MODULE.match(name):
                raise ValueError(f"{name!r} is not a module name (e.g. jax.numpy)")
        return tuple(names)

    @field_validator("prepare")
    @classmethod
    def _hook(cls, value: str | None) -> str | None:
        module, sep, function = (value or "").partition(":")
        if value is not None and not (sep and MODULE.match(module) and function.isidentifier()):
            raise ValueError(
                f"{value!r} is not module:function (e.g. trainer.allocator:preload_env)"
            )
        return value
