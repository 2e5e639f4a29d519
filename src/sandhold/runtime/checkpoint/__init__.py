"""Checkpoints of running sandboxes with CRIU and what is built on them: suspend to disk, fork,
templates that start warm, and snapshots (kept here or in S3). It builds on the sandbox core
(``sandhold.runtime``) and on templates; neither imports it back (the ``Runtime`` facade composes).

Modules:

- ``criu.py``: Whether the CRIU binary the settings name can checkpoint on this host
  (``criu_status``)
- ``criuimg.py``: The one edit Sandhold makes to a CRIU image
- ``fork.py``: Fork: one checkpoint of a running sandbox, taken in place
- ``process_tree.py``: Checkpoint and restore of a sandbox's process tree with CRIU (>= 4.1, see
  docs/runtime.md)
- ``sealing.py``: Sealing a snapshot's objects for the remote store, in bounded records
- ``snapshot_remote.py``: The snapshot store's copy in S3 (or an S3-compatible store)
- ``snapshots.py``: Snapshots: a sandbox's state saved as a persistent object of its own
- ``suspend.py``: Suspend to disk: a paused sandbox's processes checkpointed
- ``warm.py``: Templates that start warm
"""
