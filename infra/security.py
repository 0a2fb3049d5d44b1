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
