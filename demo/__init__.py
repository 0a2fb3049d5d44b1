"""`tpupod demo` and what drives the local pod like a user and a watcher would (the fault plan,
the uninterrupted reference run): unlike the rest of localpod, the local cloud, it uses ops."""
