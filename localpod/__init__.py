"""The local pod: a TPU slice on one machine, so tpupod's cloud path runs for real without GCP.

One module per concern:
  pod              LocalPod, the API the CLI, the demo and tests use (client of the daemon)
  controller       the pod daemon: emulator, metadata server, TPU API, worker agents
  tpu_api          the Cloud TPU v2 REST surface on loopback (Google's paths, fields, errors)
  tpu_nodes        nodes and long-running operations behind that API, over the slice
  tpu_client       the pod's own calls to that API, through google-cloud-tpu
  iap              the IAP stand-in: a ProxyCommand that reaches workers by instance name
  privilege        the operator's login user on workers (unprivileged when the pod runs as root)
  sudo             the workers' passwordless sudo for that login user
  slice            the lifecycle (CREATING -> READY -> PREEMPTED/TERMINATED -> deleted)
  worker           one worker "VM": subreaper, SSH server, runs the startup-script at boot
  sshserver        asyncssh server with key auth, commands via bash in the worker env
  metadata_server  GCE metadata protocol, each worker answered by the address it called
  storage          gcp-storage-emulator subprocess and the bundle upload
  environment      a worker's environment variables and metadata attributes
  state, procs     pod directory and state table; /proc facts, signals, ports
  cli              `tpupod local ...` (up, down, endpoints, faults)
"""
