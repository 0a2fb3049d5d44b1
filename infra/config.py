"""The stack's typed configuration, validated in full before any resource is declared.

`load()` reads `tpupod:*` and `gcp:project` once; every mistake becomes one `pulumi.RunError`
line that names the key, says what is wrong and how to fix it. Defaults live here, so stack files
only say what makes a stack different.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Literal

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra import catalog
from infra.metadata import DEFAULT_COORDINATOR_PORT
from infra.security import IAP_RANGE
from trainer.config import PRESETS

NAMESPACE = "tpupod"
PROVISIONING_MODES = ("spot", "preemptible", "on-demand", "reserved")
Provisioning = Literal["spot", "preemptible", "on-demand", "reserved"]
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_LIST_KEYS = {"sshSourceRanges"}


class ConfigError(ValueError):
    """One bad key: `str()` is the whole one-line message."""

    def __init__(self, key: str, problem: str):
        self.key = key if ":" in key else f"{NAMESPACE}:{key}"
        super().__init__(f"{self.key}: {problem}")


class StackConfig(BaseModel):
    """Everything the program needs from a stack, already checked."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    stack: str
    project: str = Field(alias="gcp:project")
    accelerator_type: str = Field(alias="acceleratorType")
    zone: str | None = None
    runtime_version: str | None = Field(default=None, alias="runtimeVersion")
    provisioning: Provisioning = "spot"
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
        modes = [m for m in re.split(r"[\s,+]+", str(value).strip().lower()) if m]
        unknown = [m for m in modes if m not in PROVISIONING_MODES]
        if unknown or not modes:
            raise ConfigError(
                "provisioning",
                f"unknown mode {value!r}; use one of {', '.join(PROVISIONING_MODES)}",
            )
        if {"spot", "reserved"} <= set(modes):
            raise ConfigError(
                "provisioning",
                "spot and reserved cannot be combined (spot capacity never comes from a "
                "reservation); set exactly one of them",
            )
        if len(set(modes)) > 1:
            raise ConfigError("provisioning", f"{value!r} names several modes; set exactly one")
        return modes[0]

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ConfigError(
                "preset", f"unknown preset {value!r}; use one of {', '.join(PRESETS)}"
            )
        return value

    @field_validator("ssh_source_ranges", mode="before")
    @classmethod
    def _cidrs(cls, value: Any) -> Any:
        ranges = [value] if isinstance(value, str) else list(value or ())
        for cidr in ranges:
            _check_ssh_cidr(str(cidr))
        return tuple(str(ipaddress.ip_network(str(c), strict=True)) for c in ranges)

    @field_validator("subnet_cidr")
    @classmethod
    def _subnet(cls, value: str) -> str:
        try:
            network = ipaddress.ip_network(value, strict=True)
        except ValueError:
            raise ConfigError(
                "subnetCidr", f"{value!r} is not a CIDR range like 10.64.0.0/20"
            ) from None
        if not network.is_private:
            raise ConfigError(
                "subnetCidr", f"{value} is not a private range; use e.g. 10.64.0.0/20"
            )
        return value

    @field_validator("bucket_name", "existing_bucket")
    @classmethod
    def _bucket_name(cls, value: str | None, info: Any) -> str | None:
        key = "bucketName" if info.field_name == "bucket_name" else "existingBucket"
        if value is not None:
            check_bucket_name(value, key)
        return value

    @model_validator(mode="after")
    def _fits_generation(self) -> StackConfig:
        accelerator = catalog.lookup(self.accelerator_type)
        generation = accelerator.generation.name
        if self.zone is not None and self.zone not in accelerator.zones:
            raise ConfigError(
                "zone",
                f"{self.zone} does not offer {generation}; use one of {', '.join(accelerator.zones)}",
            )
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
        return self

    # Resolved values: the catalog's defaults where the stack says nothing.
    @property
    def accelerator(self) -> catalog.Accelerator:
        return catalog.lookup(self.accelerator_type)

    @property
    def resolved_zone(self) -> str:
        return self.zone or self.accelerator.zones[0]

    @property
    def region(self) -> str:
        return self.resolved_zone.rsplit("-", 1)[0]

    @property
    def resolved_runtime_version(self) -> str:
        return self.runtime_version or self.accelerator.default_runtime_version

    @property
    def trainer_command_args(self) -> str:
        """`tpupod-trainer-args`: what follows `python -m trainer` on every worker."""
        steps = f" --steps {self.steps}" if self.steps else ""
        extra = f" {self.trainer_args.strip()}" if self.trainer_args.strip() else ""
        return f"--config {self.preset}{steps}{extra}"


def _check_ssh_cidr(cidr: str) -> None:
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ConfigError(
            "sshSourceRanges", f"{cidr!r} is not a CIDR range; write ranges like 203.0.113.0/24"
        ) from None
    if network.prefixlen == 0:
        raise ConfigError(
            "sshSourceRanges",
            f"{cidr} opens SSH to the whole internet; list your own ranges "
            f"(IAP {IAP_RANGE} is always allowed)",
        )
    if str(network) != cidr:
        raise ConfigError("sshSourceRanges", f"{cidr!r} has host bits set; did you mean {network}?")


def check_bucket_name(name: str, key: str = "bucketName") -> None:
    """Cloud Storage naming rules (https://cloud.google.com/storage/docs/buckets#naming)."""
    problem = None
    if not _BUCKET_NAME.match(name) or ".." in name:
        problem = (
            "use 3-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit"
        )
    elif name.startswith("goog") or "google" in name:
        problem = "names may not start with 'goog' or contain 'google'; pick another name"
    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        problem = "names may not look like an IP address; pick another name"
    if problem:
        raise ConfigError(key, f"{name!r} is not a valid bucket name; {problem}")


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
