"""The sandbox core: isolated sandboxes on this host (namespaces, cgroups, an overlay root,
seccomp, uid ranges, disk budgets), behind the ``Runtime`` facade. Plain synchronous code; the
sandbox service (``sandhold.service``) moves it off the event loop. Two subpackages build on it:
``templates`` (root filesystems and their builds, images, layers) and ``checkpoint`` (CRIU:
suspend, fork, warm starts, snapshots); the in-sandbox program is ``sandhold.agent``.

Modules:

- ``agentlib.py``: The read-only copy of the agent's code (and its one dependency, h11) that
  sandboxes run
- ``assembly.py``: A sandbox's directory claimed, its root prepared, and every trace of it removed
- ``boot.py``: Booting a sandbox's process tree over a prepared root (assembly.prepare_root)
- ``cgroup_files.py``: What both cgroup backends share: the files, the ``Group`` interface
- ``cgroup_parent.py``: The cgroup parent of a data dir's sandboxes, and the claim that keeps it
  theirs
- ``cgroup_scope.py``: Under systemd (cgroup v2), the sandboxes' scope beside the server's unit
- ``cgroup_v1.py``: The cgroup v1 backend, for hybrid hosts
- ``cgroup_v2.py``: The cgroup v2 backend: the unified hierarchy, a delegated subtree
- ``cgroups.py``: Per-sandbox cgroups on either kind of host: the backend chosen once
- ``client.py``: A client of one sandbox on this host, over its agent's unix socket
- ``disk.py``: A disk budget per sandbox, enforced by the kernel
- ``doctor.py``: `sandhold doctor`: what the runtime needs from this host, checked for real, with
  the fix
- ``host.py``: The parts of this host that sandbox operations share (``Host``), and the runtime's
  API as features built on it see it (``Sandboxes``)
- ``idmap.py``: Idmapped mounts (Linux >= 5.12; overlayfs layers >= 5.19)
- ``images.py``: Filesystem images on loop devices
- ``instance.py``: This data dir's identity: a random id written once in ``<data_dir>/instance``
- ``ksm.py``: Kernel samepage merging for sandbox memory (``memory_merge``, off by default)
- ``liveness.py``: Whether a sandbox still runs, and what becomes of one found dead
- ``launcher.py``: Starting a sandbox's process tree: bubblewrap inside a user namespace whose uid
  map we write
- ``mounts.py``: Host-side mounts of a sandbox (its copy-on-write root), made with mount(2) directly
- ``pool.py``: Pools of sandboxes booted ahead
- ``reaping.py``: Waiting for a sandbox's processes to be gone
- ``reconcile.py``: Reconcile: make what is on disk and in the kernel match the sandboxes that
  really exist
- ``record_store.py``: The records on disk: the per-sandbox lock, load, save, a version cache
- ``records.py``: What the runtime records about a sandbox
- ``runtime.py``: ``Runtime``, the facade: creates, lists, pauses, resumes and destroys sandboxes
- ``safefs.py``: File operations in trees that came from a user
- ``sandbox_log.py``: A sandbox's log (its agent's events, processes, services' output), read
  back as entries
- ``seccomp.py``: The seccomp filter every sandbox runs under
- ``spec.py``: What a sandbox is made of: the validated request the runtime turns into namespaces
- ``staging.py``: Directories a piece of work builds in before it renames the result into place
- ``sudo_client.py``: The ``sudo`` command of ``base``
- ``uids.py``: A host uid/gid range per sandbox, so that no two sandboxes share a host identity
- ``wsdisk.py``: A disk budget per workspace, enforced by the kernel
"""
