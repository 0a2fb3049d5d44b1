"""Security constants shared by the components and the policy rules (pure: no Pulumi import).

An opt-in must be visible to the policy pack, which sees resources, not stack config: the
component that honours an opt-in writes the marker below onto the resource it relaxes.
"""

from __future__ import annotations

# Google's IAP TCP-forwarding source range (https://cloud.google.com/iap/docs/using-tcp-forwarding).
IAP_RANGE = "35.235.240.0/20"
# TPU label: the stack set `tpupod:enableExternalIps: true`.
EXTERNAL_IPS_LABEL = ("tpupod-external-ips", "opted-in")
# Bucket label: the stack set `tpupod:protectBucket: false`.
UNPROTECTED_LABEL = ("tpupod-protect", "opted-out")
# Firewall description prefix: SSH from the ranges the stack listed in `tpupod:sshSourceRanges`.
LISTED_SSH_MARKER = "tpupod:ssh-listed-ranges"

# CIS GCP 4.4 / 4.9: OS Login on and project-wide SSH keys blocked on every TPU node. gcloud's
# `tpu-vm ssh` reads `enable-oslogin` from the node (command_lib/compute/tpus/tpu_vm/ssh.py,
# TpuHasOsLoginEnabled) and logs in as the caller's OS Login user.
OS_LOGIN_METADATA = {"enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"}
# Cloud Storage soft delete: 7 to 90 days (0 turns it off), storage.Bucket soft_delete_policy.
SOFT_DELETE_DAYS_DEFAULT = 7
SOFT_DELETE_DAYS_RANGE = (7, 90)
