"""The time-based save decision's keys in the coordinator's store: process 0 writes one a step
(trainer.save_policy.AgreedTimePolicy) and deletes them a block at a time, so a run of a million
steps does not leave a million keys behind. Against JAX's own coordination service (one process,
in a subprocess: jax.distributed is process-wide state)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from trainer_testlib import free_port

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=1, process_id=0)
    from jax._src import distributed
    import trainer.save_policy as sp
    from trainer.save_policy import PREFIX, AgreedTimePolicy, key

    sp.BLOCK = BLOCK = 10  # the module's 1000, scaled down: 25 calls, not 2500

    client = distributed.global_state.client
    policy = AgreedTimePolicy(60)
    kept = lambda: sorted({k.split("/")[-2] for k, _ in client.key_value_dir_get(PREFIX + "/")})
    seen = {}
    for step in range(0, int(2.5 * BLOCK)):
        policy.tell(client, step, step % 7 == 0)
        if step in (BLOCK - 1, 2 * BLOCK + 3):
            seen[step] = kept()
    # what another process reads for a step of the current block: the decision, at once
    seen["read"] = [client.blocking_key_value_get(key(s), 1000) for s in (22, 21)]
    seen["count"] = len(client.key_value_dir_get(PREFIX + "/"))
    print(json.dumps(seen))
    jax.distributed.shutdown()
    """
)


def test_old_blocks_of_decisions_are_deleted_and_current_ones_read():
    out = subprocess.run([sys.executable, "-c", SCRIPT, f"127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # negative control: within the first block nothing is deleted, every key is there
    assert seen["9"] == ["0"]
    # two blocks on, block 0 is gone; blocks 1 and 2 stay (the others may still read them)
    assert seen["23"] == ["1", "2"]
    assert seen["read"] == ["0", "1"]  # step 22 was not due, 21 was (21 % 7 == 0)
    assert seen["count"] == 10 + 5  # block 1 whole, block 2 to step 24
