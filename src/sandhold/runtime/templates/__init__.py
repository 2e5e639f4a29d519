"""Templates: read-only root filesystems and their defaults, and everything that makes them
(steps and Dockerfiles run in build sandboxes, OCI images pulled and unpacked, the layer store).
It builds on the sandbox core (``sandhold.runtime``) and never on checkpoints.

Modules:

- ``build.py``: Building templates from steps: what E2B's ``Template`` builder sends
- ``copy_archive.py``: A template COPY's uploaded archive, read on the host without extracting it
- ``dockerfile.py``: A Dockerfile subset read into a template build's steps (build.py)
- ``from_image.py``: Templates made of OCI images (a build's ``from_image`` base)
- ``host_etc.py``: What a template built on the host's ``/usr`` takes from the host's ``/etc``
- ``layer_scan.py``: What an image's layers would write, counted before anything is unpacked
- ``layers.py``: The layer store (``data_dir/templates/.layers/<id>/``)
- ``oci.py``: OCI images from a registry, unpacked into a root filesystem directory
- ``prebuild.py``: Build a template in a process of its own
- ``registries.py``: The package registries this machine is configured to use (pip, npm, apt)
- ``registry_access.py``: Which registries an image pull may reach
- ``rootfs_owners.py``: What makes a root filesystem a sandbox's (``base``'s skeleton, an image's
  root)
- ``store.py``: ``Template`` and ``TemplateStore``: root filesystems plus defaults (user, workdir,
  env), in ``data_dir/templates``
"""
