"""Stand-in for `python -m trainer` while the real trainer is not in the tree (stdlib only).

Speaks the same seams: reads TPUPOD_* from the environment, writes the status file, exits 75 on
SIGTERM (as the real trainer does after its preemption checkpoint) and 0 after --steps steps.
"""

import json
import os
import signal
import sys
import time

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
path = os.environ["TPUPOD_STATUS_FILE"]
stop = False


def write(state, step, exit_code=None):
    doc = dict(
        state=state,
        step=step,
        exit_code=exit_code,
        process_id=int(os.environ["TPUPOD_PROCESS_ID"]),
        pid=os.getpid(),
        heartbeat=time.time(),
    )
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
print("stand-in trainer", sys.argv[1:], os.environ["TPUPOD_COORDINATOR"], flush=True)
write("initializing", 0)
for step in range(1, steps + 1):
    if stop:
        write("preempted", step - 1, 75)
        sys.exit(75)
    time.sleep(0.2)
    write("training", step)
write("done", steps, 0)
