"""The local pod: a TPU slice on one machine, so tpupod's cloud path runs for real without GCP.

One module per concern:
  pod              LocalPod, the API the CLI, ops provider and tests use (client of the daemon)
  controller       the pod daemon: emulator, metadata server, worker agents, loopback API
  slice            the lifecycle (CREATING -> READY -> PREEMPTED/TERMINATED -> deleted)
  worker           one worker "VM": subreaper, SSH server, runs the startup-script at boot
  sshserver        asyncssh server with key auth, commands via bash in the worker env
  metadata_server  GCE metadata protocol, each worker answered by the address it called
  storage          gcp-storage-emulator subprocess and the bundle upload
  environment      a worker's environment variables and metadata attributes
  state, procs     pod directory and state table; /proc facts, signals, ports
  cli              `tpupod local ...` and the first `tpupod status`
"""
