"""Metadata keys with a meaning beyond labels: what a create's metadata may carry to ask for
host mounts (and a disk budget for the one at /workspace), a file view or a secrets scope. The
E2B surface parses them out of a create's metadata (they never reach the sandbox's labels); the
gateway's e2b provider writes them."""

HOST_MOUNT_KEY = "host-mount"  # CubeSandbox's: a JSON list of {hostPath, mountPath, readOnly}
FILE_VIEW_KEY = "sandhold.file-view"  # {"read": [...], "write": [...]}: what the file API may touch
SECRETS_SCOPE_KEY = "sandhold.secrets-scope"  # whose secrets the egress proxy injects
WORKSPACE_DISK_KEY = "sandhold.workspace-disk-mb"  # the host-mount /workspace's budget (MiB)
