"""`tpupod local stockout|answer`: what the pod's Cloud TPU API answers next, on demand.

`stockout` refuses the next creates (capacity, quota, or an outage for any call); `answer` makes
the API give what Google gives and a healthy pod never does (localpod.gcp.tpu_faults): a node state
the client does not know, Google's UNKNOWN, a spot node under maintenance that keeps running, a
queued request FAILED for each reason or in a state the client does not know.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from localpod.gcp.tpu_faults import FAILURES
from localpod.pod import LocalPod
from localpod.state import PodError
from localpod.vm.metadata_server import ZONES


def _say(args: argparse.Namespace, action) -> int:
    Console().print(action(LocalPod(getattr(args, "pod_dir", None))))
    return 0


def _stockout(args: argparse.Namespace) -> int:
    if args.count < 1:
        raise PodError("--count must be >= 1")
    where = f" in {args.zone}" if args.zone else ""
    if args.unavailable:
        return _say(args, lambda pod: f"next {pod.inject_unavailable(args.count)} TPU API "
                    "call(s) will answer HTTP 503 UNAVAILABLE")  # fmt: skip
    if args.quota:
        scope = "region" if args.region else "zone"
        return _say(args, lambda pod: f"next {pod.inject_quota(args.count, args.zone, scope)} "
                    f"create(s){where} refused for the {scope}'s quota (HTTP 429)")  # fmt: skip
    return _say(args, lambda pod: f"next {pod.inject_stockout(args.count, args.zone)} "
                f"create(s){where} will be stocked out (a queued resource waits)")  # fmt: skip


def _answer(args: argparse.Namespace) -> int:
    if args.what == "clear":
        return _say(args, lambda pod: pod.clear_answers() or "every answer and refusal cleared")
    if args.count < 1:
        raise PodError("--count must be >= 1")
    if args.what == "node":
        if args.fail or not (args.state or args.health):
            raise PodError("`answer node` takes --state and/or --health")
        return _say(args, lambda pod: f"the node answers {pod.answer_node(args.state, args.health)}"
                    " until it is deleted")  # fmt: skip
    if args.health or not (args.fail or args.state):
        raise PodError("`answer request` takes --fail KIND or --state STATE")
    what = f"FAILED ({args.fail})" if args.fail else f"state {args.state}, never provisioned"
    where = f" in {args.zone}" if args.zone else ""
    return _say(
        args,
        lambda pod: (
            "next "
            + str(pod.answer_requests(args.fail, args.state, args.count, args.zone))
            + f" queued request(s) filed{where}: {what}"
        ),
    )


def register(sub: argparse._SubParsersAction, pod_dir: argparse.ArgumentParser) -> None:
    stockout = sub.add_parser(
        "stockout", parents=[pod_dir], help="fail the next create(s) with RESOURCE_EXHAUSTED"
    )
    stockout.add_argument("--count", type=int, default=1, help="creates to fail")
    stockout.add_argument("--zone", choices=ZONES, help="only in this zone [any zone]")
    stockout.add_argument(
        "--unavailable", action="store_true",
        help="instead: the next COUNT TPU API calls of any kind answer HTTP 503 (an outage)",
    )  # fmt: skip
    stockout.add_argument(
        "--quota", action="store_true",
        help="refuse at once with HTTP 429 naming the zone's quota, as a spent quota does",
    )  # fmt: skip
    stockout.add_argument("--region", action="store_true",
                          help="with --quota: the region's quota instead")  # fmt: skip
    stockout.set_defaults(func=_stockout)

    answer = sub.add_parser(
        "answer", parents=[pod_dir],
        help="make the TPU API answer as Google may and a healthy pod never does: the node's "
        "state or health, or how the next queued requests end",
    )  # fmt: skip
    answer.add_argument("what", choices=("node", "request", "clear"))
    answer.add_argument("--state", help="a state name (one the client lacks reads as "
                        "STATE_UNSPECIFIED), or a number as a new state arrives")  # fmt: skip
    answer.add_argument("--health", help="node: e.g. UNHEALTHY_MAINTENANCE (a spot node keeps "
                        "running)")  # fmt: skip
    answer.add_argument("--fail", choices=tuple(FAILURES),
                        help="request: FAILED with Google's error for this reason")  # fmt: skip
    answer.add_argument("--count", type=int, default=1, help="request: how many [1]")
    answer.add_argument("--zone", choices=ZONES, help="request: only in this zone [any zone]")
    answer.set_defaults(func=_answer)
