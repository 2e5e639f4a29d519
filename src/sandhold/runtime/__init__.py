"""The runtime: isolated sandboxes on this host (namespaces, cgroups, an overlay root, seccomp),
their templates, layers and images, checkpoints, suspend, fork and snapshots. Plain synchronous
code; the sandbox service (``sandhold.service``) moves it off the event loop.

Modules:

- ``agentlib.py``: The read-only copy of the agent's code (and its one dependency, h11) that
  sandboxes run
- ``assembly.py``: A sandbox's directory claimed, its root prepared, and every trace of it removed
- ``boot.py``: Booting a sandbox's process tree over a prepared root (assembly.prepare_root)
- ``build.py``: Building templates from steps: what E2B's ``Template`` builder sends
- ``cgroups.py``: Per-sandbox cgroups
- ``checkpoint.py``: Checkpoint and restore of a sandbox's process tree with CRIU (>= 4.1, see
  docs/runtime.md)
- ``client.py``: A client of one sandbox on this host, over its agent's unix socket
- ``copy_archive.py``: A template COPY's uploaded archive, read on the host without extracting it
- ``criu.py``: Whether the CRIU binary the settings name can checkpoint on this host
  (``criu_status``)
- ``criuimg.py``: The one edit Sandhold makes to a CRIU image
- ``disk.py``: A disk budget per sandbox, enforced by the kernel
- ``dockerfile.py``: A Dockerfile subset read into a template build's steps (build.py)
- ``doctor.py``: `sandhold doctor`: what the runtime needs from this host, checked for real, with
  the fix
- ``fork.py``: Fork: one checkpoint of a running sandbox, taken in place
- ``host.py``: The parts of this host that sandbox operations share (``Host``), and the runtime's
  API as features built on it see it (``Sandboxes``)
- ``idmap.py``: Idmapped mounts (Linux >= 5.12; overlayfs layers >= 5.19)
- ``image_templates.py``: Templates made of OCI images (a build's ``from_image`` base)
- ``images.py``: Filesystem images on loop devices
- ``ksm.py``: Kernel samepage merging for sandbox memory (``memory_merge``, off by default)
- ``liveness.py``: Whether a sandbox still runs, and what becomes of one found dead
- ``launcher.py``: Starting a sandbox's process tree: bubblewrap inside a user namespace whose uid
  map we write
- ``layer_scan.py``: What an image's layers would write, counted before anything is unpacked
- ``layers.py``: The layer store (``data_dir/templates/.layers/<id>/``)
- ``mounts.py``: Host-side mounts of a sandbox (its copy-on-write root), made with mount(2) directly
- ``oci.py``: OCI images from a registry, unpacked into a root filesystem directory (template
  builds)
- ``pool.py``: Pools of sandboxes booted ahead
- ``prebuild.py``: Build a template in a process of its own
- ``reaping.py``: Waiting for a sandbox's processes to be gone
- ``reconcile.py``: Reconcile: make what is on disk and in the kernel match the sandboxes that
  really exist
- ``record_store.py``: The records on disk: the per-sandbox lock, load, save, a version cache
- ``records.py``: What the runtime records about a sandbox
- ``registries.py``: The package registries this machine is configured to use (pip, npm, apt)
- ``registry_access.py``: Which registries an image pull may reach
- ``rootfs_owners.py``: What makes a root filesystem a sandbox's (``base``'s skeleton, an image's
  root)
- ``runtime.py``: ``Runtime``, the facade: creates, lists, pauses, resumes and destroys sandboxes
- ``safefs.py``: File operations in trees that came from a user
- ``seccomp.py``: The seccomp filter every sandbox runs under
- ``snapshot_remote.py``: The snapshot store's copy in S3 (or an S3-compatible store)
- ``snapshots.py``: Snapshots: a sandbox's state saved as a persistent object of its own
- ``spec.py``: What a sandbox is made of: the validated request the runtime turns into namespaces
- ``staging.py``: Directories a piece of work builds in before it renames the result into place
- ``sudo_client.py``: The ``sudo`` command of ``base``
- ``suspend.py``: Suspend to disk: a paused sandbox's processes checkpointed
- ``templates.py``: Templates: read-only root filesystems plus defaults (user, workdir, env)
- ``uids.py``: A host uid/gid range per sandbox, so that no two sandboxes share a host identity
- ``warm.py``: Templates that start warm
- ``wsdisk.py``: A disk budget per workspace, enforced by the kernel
"""
