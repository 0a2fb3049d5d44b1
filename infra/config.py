"""The stack's typed configuration, validated in full before any resource is declared.

`load()` reads `tpupod:*` and `gcp:project` once; every mistake becomes one `pulumi.RunError`
line that names the key, says what is wrong and how to fix it. Defaults live here, so stack files
only say what makes a stack different.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any, Literal

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contract import job as jobs
from contract.metadata import DEFAULT_COORDINATOR_PORT
from infra import builtin_job, catalog, exposure
from infra.api_choice import check_api, check_api_offered
from infra.config_checks import (
    NAMESPACE,
    ConfigError,
    check_bucket_name,
    check_create_via,
    check_data_location,
    check_provisioning,
    check_ssh_cidr,
    check_subnet,
    check_zones,
)
from infra.security import SOFT_DELETE_DAYS_DEFAULT, SOFT_DELETE_DAYS_RANGE

Provisioning = Literal["spot", "preemptible", "on-demand", "reserved"]
_LIST_KEYS = {"sshSourceRanges", "zones"}
DATA_PREFIX = "data/"  # where a stack's own bucket keeps prepared data (infra.identity grants it)
# The watcher VM (infra/watcher_vm.py): small shared-core and general-purpose types are enough for a
# loop that polls one API and a few SSH sessions; e2-small is the default.
WATCHER_MACHINE_TYPES = ("e2-micro", "e2-small", "e2-medium", "e2-standard-2", "n2-standard-2",
                         "n2d-standard-2", "t2d-standard-1")  # fmt: skip
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # `tpupod:job` paths are relative to it
_BOOLS = {"true": True, "false": False, True: True, False: False}


class StackConfig(BaseModel):
    """Everything the program needs from a stack, already checked."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    stack: str
    project: str = Field(alias="gcp:project")
    accelerator_type: str = Field(alias="acceleratorType")
    zone: str | None = None
    runtime_version: str | None = Field(default=None, alias="runtimeVersion")
    provisioning: Provisioning = "spot"
    # Which Google API makes the slice: `tpu` (the Cloud TPU API's node) or `compute` (a
    # Compute Engine MIG under a workload policy); default: the TPU API where it offers the type.
    api: str | None = None
    # Recovery: where the slice may be recreated, in order (default: its zone), and how it asks
    # for capacity: a queued resource (Google's recommendation) or nodes.create.
    zones: tuple[str, ...] = ()
    create_via: str = Field(default="queued", alias="createVia")
    queue_valid_hours: float | None = Field(default=None, gt=0, alias="queueValidHours")
    reservation: str | None = None  # a reservation's name, for provisioning: reserved
    # The job every worker runs: a directory (relative to the repository) with tpupod-job.yaml;
    # without one, the built-in trainer's job, shaped by preset, steps, trainerArgs and data.
    job: str | None = None
    run_id: str = Field(default="main", alias="runId")  # a new id starts a new run (directory)
    preset: str = "tiny"
    steps: int | None = Field(default=None, gt=0)
    trainer_args: str = Field(default="", alias="trainerArgs")
    ssh_source_ranges: tuple[str, ...] = Field(default=(), alias="sshSourceRanges")
    bucket_name: str | None = Field(default=None, alias="bucketName")
    existing_network: str | None = Field(default=None, alias="existingNetwork")
    existing_subnet: str | None = Field(default=None, alias="existingSubnet")
    existing_bucket: str | None = Field(default=None, alias="existingBucket")
    enable_external_ips: bool = Field(default=False, alias="enableExternalIps")
    protect_bucket: bool = Field(default=True, alias="protectBucket")
    subnet_cidr: str = Field(default="10.64.0.0/20", alias="subnetCidr")
    coordinator_port: int = Field(default=DEFAULT_COORDINATOR_PORT, alias="coordinatorPort")
    soft_delete_days: int = Field(default=SOFT_DELETE_DAYS_DEFAULT, alias="softDeleteDays")
    watcher: bool = True
    watcher_machine_type: str = Field(default="e2-small", alias="watcherMachineType")
    # Prepared training data (`python -m trainer.data prepare`): a name under the stack bucket's
    # `data/` prefix (workers get read-only access there), or gs://BUCKET/PATH anywhere else.
    data: str | None = None

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        try:
            return jobs.check_run_id(value, "the id")
        except jobs.JobError as err:
            raise ConfigError("runId", str(err)) from None

    @model_validator(mode="after")
    def _one_job(self) -> StackConfig:
        builtin_keys = {"preset": "preset", "steps": "steps", "trainer_args": "trainerArgs",
                        "data": "data"}  # fmt: skip
        if self.job is not None:
            given = [
                alias for field, alias in builtin_keys.items() if field in self.model_fields_set
            ]
            if given:
                raise ConfigError(
                    given[0],
                    f"shapes the built-in trainer, but this stack runs tpupod:job {self.job}; "
                    "remove one of the two (a job's own settings live in its tpupod-job.yaml)",
                )
        self.job_definition()  # a bad job directory stops here, before any resource exists
        return self

    def job_definition(self) -> jobs.Job:
        """The job the workers run (the built-in trainer's unless tpupod:job names one)."""
        if self.job is None:
            return builtin_job.builtin(self.trainer_command_args)
        try:
            return jobs.load(PROJECT_ROOT / self.job)
        except jobs.JobError as err:
            raise ConfigError("job", str(err)) from None

    @field_validator("data")
    @classmethod
    def _data_location(cls, value: str | None) -> str | None:
        return None if value is None else check_data_location(value)

    @field_validator("watcher", mode="before")
    @classmethod
    def _watcher_flag(cls, value: Any) -> bool:
        flag = _BOOLS.get(value.strip().lower() if isinstance(value, str) else value)
        if flag is None:
            raise ConfigError(
                "watcher",
                f"{value!r} is not true or false; `true` (the default) declares the watcher VM "
                "that recovers the slice, `false` opts out (then keep `tpupod watch` running)",
            )
        return flag

    @field_validator("watcher_machine_type")
    @classmethod
    def _watcher_machine(cls, value: str) -> str:
        if value not in WATCHER_MACHINE_TYPES:
            raise ConfigError(
                "watcherMachineType",
                f"unknown machine type {value!r}; use one of {', '.join(WATCHER_MACHINE_TYPES)}",
            )
        return value

    @model_validator(mode="after")
    def _data_readable(self) -> StackConfig:
        from infra import naming

        own = f"gs://{naming.bucket_name(self)}/"
        if self.data_uri and self.data_uri.startswith(own) and not self.data_in_stack_bucket:
            raise ConfigError(
                "data",
                f"{self.data_uri} is in the stack's bucket but outside {DATA_PREFIX}, which is "
                f"all the workers may read there; prepare it under {own}{DATA_PREFIX}",
            )
        return self

    @field_validator("project", mode="before")
    @classmethod
    def _project_set(cls, value: Any) -> Any:
        if not value:
            raise ConfigError(
                "gcp:project", "not set; run `pulumi config set gcp:project YOUR_PROJECT_ID`"
            )
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _known_accelerator(cls, value: str) -> str:
        try:
            return catalog.lookup(value).name
        except catalog.CatalogError as error:
            raise ConfigError("acceleratorType", str(error)) from None

    @field_validator("provisioning", mode="before")
    @classmethod
    def _one_provisioning_mode(cls, value: Any) -> Any:
        return check_provisioning(value)

    @field_validator("api", mode="before")
    @classmethod
    def _one_api(cls, value: Any) -> Any:
        return None if value is None else check_api(value)

    @field_validator("zones", mode="before")
    @classmethod
    def _zone_list(cls, value: Any) -> Any:
        return _decode_list(value) if isinstance(value, str) else value

    @field_validator("create_via", mode="before")
    @classmethod
    def _create_via(cls, value: Any) -> str:
        return check_create_via(value)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        presets = builtin_job.preset_steps()
        if value not in presets:
            raise ConfigError(
                "preset", f"unknown preset {value!r}; use one of {', '.join(presets)}"
            )
        return value

    @field_validator("ssh_source_ranges", mode="before")
    @classmethod
    def _cidrs(cls, value: Any) -> Any:
        ranges = [value] if isinstance(value, str) else list(value or ())
        for cidr in ranges:
            check_ssh_cidr(str(cidr))
        return tuple(str(ipaddress.ip_network(str(c), strict=True)) for c in ranges)

    @field_validator("soft_delete_days")
    @classmethod
    def _soft_delete_range(cls, value: int) -> int:
        low, high = SOFT_DELETE_DAYS_RANGE
        if not low <= value <= high:
            raise ConfigError(
                "softDeleteDays",
                f"{value} is outside Cloud Storage's soft-delete range; use {low} to {high} days",
            )
        return value

    @field_validator("subnet_cidr")
    @classmethod
    def _subnet(cls, value: str) -> str:
        return check_subnet(value)

    @field_validator("bucket_name", "existing_bucket")
    @classmethod
    def _bucket_name(cls, value: str | None, info: Any) -> str | None:
        key = "bucketName" if info.field_name == "bucket_name" else "existingBucket"
        if value is not None:
            check_bucket_name(value, key)
        return value

    @model_validator(mode="after")
    def _keys_fit_together(self) -> StackConfig:
        accelerator = catalog.lookup(self.accelerator_type)
        generation = accelerator.generation.name
        check_api_offered(self.api, accelerator, self.model_fields_set, self)
        offered = accelerator.zones_on(self.resolved_api)
        if self.zone is not None and self.zone not in offered:
            raise ConfigError(
                "zone",
                f"{self.zone} does not offer {generation}"
                f"{' on Compute Engine' if self.resolved_api == catalog.COMPUTE else ''}; "
                f"use one of {', '.join(offered)}",
            )
        object.__setattr__(self, "zones", check_zones(self.zones, self.zone,
                                                      offered, generation))  # fmt: skip
        if self.reservation and len(self.zones) > 1:
            raise ConfigError("reservation", "a reservation lives in one zone; list only that "
                              "zone in tpupod:zones, or remove one of the two keys")  # fmt: skip
        if self.reservation and self.provisioning != "reserved":
            raise ConfigError("reservation", f"names a reservation, but tpupod:provisioning is "
                              f"{self.provisioning}; set it to reserved or remove the key")  # fmt: skip
        runtime_generation = (
            catalog.generation_of_runtime(self.runtime_version) if self.runtime_version else None
        )
        if runtime_generation not in (None, generation):
            raise ConfigError(
                "runtimeVersion",
                f"{self.runtime_version} is a {runtime_generation} runtime but "
                f"{accelerator.name} is {generation}; use "
                f"{accelerator.default_runtime_version} or remove the key",
            )
        if (self.existing_network is None) != (self.existing_subnet is None):
            raise ConfigError(
                "existingSubnet" if self.existing_subnet is None else "existingNetwork",
                "existingNetwork and existingSubnet go together; set both or neither",
            )
        if self.bucket_name and self.existing_bucket:
            raise ConfigError("bucketName", "set bucketName or existingBucket, not both")
        opened = exposure.measure(self.ssh_source_ranges, self.vpc_cidrs)
        if not opened.narrow:
            raise ConfigError("sshSourceRanges", exposure.describe(opened, "SSH", self.vpc_cidrs))
        return self

    # Resolved values: the catalog's defaults where the stack says nothing.
    @property
    def accelerator(self) -> catalog.Accelerator:
        return catalog.lookup(self.accelerator_type)

    @property
    def vpc_cidrs(self) -> tuple[str, ...]:
        """The VPC's own ranges as far as the stack knows them (none for an existing network)."""
        return () if self.existing_network else (self.subnet_cidr,)

    @property
    def resolved_api(self) -> str:
        return self.api or self.accelerator.default_api

    @property
    def resolved_zone(self) -> str:
        return self.zone or (self.zones or self.accelerator.zones_on(self.resolved_api))[0]

    @property
    def capacity(self) -> dict[str, Any]:
        """How recovery asks for the slice: the node spec's `capacity` (ops.cloud.target.Target)."""
        valid = self.queue_valid_hours
        direct = self.resolved_api == catalog.COMPUTE  # no queued resources there
        return {
            "via": "direct" if direct else self.create_via,
            "zones": list(self.zones or (self.resolved_zone,)),
            "valid_for_s": valid * 3600 if valid else None,
            "reservation": self.reservation,
        }

    @property
    def region(self) -> str:
        return self.resolved_zone.rsplit("-", 1)[0]

    @property
    def resolved_runtime_version(self) -> str:
        return self.runtime_version or self.accelerator.default_runtime_version

    @property
    def trainer_command_args(self) -> str:
        """What follows `python -m trainer` in the built-in job's `run`."""
        steps = f" --steps {self.steps}" if self.steps else ""
        data = f" --set data={self.data_uri}" if self.data_uri else ""
        extra = f" {self.trainer_args.strip()}" if self.trainer_args.strip() else ""
        return f"--config {self.preset}{steps}{data}{extra}"

    @property
    def data_uri(self) -> str | None:
        """`tpupod:data` as the trainer reads it: gs://BUCKET/PATH."""
        from infra import naming  # naming builds on this module

        if self.data is None or self.data.startswith("gs://"):
            return self.data
        return f"gs://{naming.bucket_name(self)}/{DATA_PREFIX}{self.data.removeprefix(DATA_PREFIX)}"

    @property
    def data_in_stack_bucket(self) -> bool:
        """The data lies under the stack bucket's data/ prefix: the workers need that grant."""
        from infra import naming

        uri = self.data_uri
        return uri is not None and uri.startswith(f"gs://{naming.bucket_name(self)}/{DATA_PREFIX}")


def parse(raw: dict[str, Any], *, stack: str) -> StackConfig:
    """Validate raw config values (keys as in the stack file); ConfigError on the first problem."""
    unknown = sorted(set(raw) - _known_keys())
    if unknown:
        known = sorted(k for k in _known_keys() if ":" not in k)
        raise ConfigError(unknown[0], f"unknown key; known keys: {', '.join(known)}")
    if "acceleratorType" not in raw:
        raise ConfigError("acceleratorType", "not set; add e.g. `tpupod:acceleratorType: v4-8`")
    try:
        return StackConfig.model_validate({"stack": stack, "gcp:project": None, **raw})
    except ValidationError as error:
        raise _first_problem(error) from None


def _known_keys() -> set[str]:
    return {f.alias or name for name, f in StackConfig.model_fields.items() if name != "stack"}


def _first_problem(error: ValidationError) -> ConfigError:
    first = error.errors()[0]
    original = (first.get("ctx") or {}).get("error")
    if isinstance(original, ConfigError):
        return original
    field = str(first["loc"][0]) if first["loc"] else "config"
    model_field = StackConfig.model_fields.get(field)
    key = (model_field.alias if model_field else None) or field
    return ConfigError(key, f"{first['msg']} (got {first.get('input')!r})")


def raw_from_config_map(config_map: dict[str, Any]) -> dict[str, Any]:
    """`namespace:key` config (as the engine hands it over) -> the raw values `parse` takes."""
    raw: dict[str, Any] = {}
    for full_key, value in config_map.items():
        namespace, _, key = full_key.partition(":")
        if namespace == NAMESPACE:
            raw[key] = _decode_list(value) if key in _LIST_KEYS else value
    raw["gcp:project"] = config_map.get("gcp:project")
    return raw


def read_raw() -> dict[str, Any]:
    """The stack's `tpupod:*` values plus `gcp:project`, from the running Pulumi program."""
    runtime_config = pulumi.runtime.config
    config_map = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    config_map["gcp:project"] = pulumi.Config("gcp").get("project")
    return raw_from_config_map(config_map)


def _decode_list(value: Any) -> Any:
    if isinstance(value, str) and value.strip().startswith("["):
        return json.loads(value)
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def load() -> StackConfig:
    """Read and validate once; a bad stack stops here, before any resource exists."""
    try:
        return parse(read_raw(), stack=pulumi.get_stack())
    except ConfigError as error:
        raise pulumi.RunError(str(error)) from None
