"""Resource options for a component's children: the component as their parent, and the
component's own `depends_on` passed on to them. Pulumi does not pass it on by itself: depending
ON a component waits for all of its children, but a component's own depends_on holds back only
its own registration, so without this a TPU node could be created before the APIs, the NAT or
the IAM grants its component was declared to wait for."""

from __future__ import annotations

import pulumi


def child_options(
    component: pulumi.ComponentResource, opts: pulumi.ResourceOptions | None, **extra
) -> pulumi.ResourceOptions:
    deps = opts.depends_on if opts is not None else None
    inherited = [] if deps is None else list(deps) if isinstance(deps, list | tuple) else [deps]
    mine = extra.pop("depends_on", [])
    return pulumi.ResourceOptions(parent=component, depends_on=[*inherited, *mine] or None, **extra)
