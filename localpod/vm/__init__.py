"""The local pod's VMs: metadata servers, SSH workers, the watcher VM, IAP."""
