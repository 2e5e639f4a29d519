"""`sandhold secret`: tenant credentials in custody for the egress proxy (see docs/egress.md)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from sandhold.cli.common import console, fail
from sandhold.errors import SandholdError

app = typer.Typer(
    no_args_is_help=True,
    help="Tenant credentials: stored encrypted, injected by the egress proxy, never shown.",
)


def _secrets() -> Any:
    from sandhold.config import get_settings
    from sandhold.egress.secrets import open_store

    s = get_settings()
    return open_store(s)


@app.command("set")
def secret_set(
    tenant: str,
    name: str,
    host: Annotated[list[str], typer.Option(help="domain or *.domain to inject into (repeat)")],
    header: Annotated[str, typer.Option(help="header the credential goes into")] = "Authorization",
    format: Annotated[str, typer.Option(help="header value; {secret} is the credential")] = (
        "Bearer {secret}"
    ),
) -> None:
    """Store a secret, read from stdin (never from the command line, which `ps` shows)."""
    if sys.stdin.isatty():
        value = typer.prompt("secret value", hide_input=True)
    else:
        value = sys.stdin.read().rstrip("\r\n")
    try:
        info = _secrets().set(tenant, name, value, host, header=header, format=format)
    except SandholdError as e:
        fail(e)
    console.print(f"stored secret {info.name!r} of tenant {info.tenant!r} for {', '.join(host)}")


@app.command("ls")
def secret_ls(
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List secrets (names, hosts and headers; never values)."""
    from rich.table import Table

    try:
        items = _secrets().list(tenant)
    except SandholdError as e:
        fail(e)
    if as_json:
        print(json.dumps([i.to_json() for i in items]))
        return
    table = Table("tenant", "name", "hosts", "header", "format", "key")
    for i in items:
        table.add_row(i.tenant, i.name, ", ".join(i.hosts), i.header, i.format, i.key_id)
    console.print(table)


@app.command("rm")
def secret_rm(tenant: str, name: str) -> None:
    """Delete a secret."""
    try:
        _secrets().remove(tenant, name)
    except SandholdError as e:
        fail(e)
    console.print(f"removed secret {name!r} of tenant {tenant!r}")


@app.command("rotate-key")
def secret_rotate_key() -> None:
    """Add a new key (key file) and re-encrypt every secret with the newest key."""
    try:
        store = _secrets()
        if store.keyring.file is not None:
            store.keyring.add_new_key()
        n = store.rotate()
    except SandholdError as e:
        fail(e)
    console.print(f"re-encrypted {n} secret(s) with key {store.keyring.current[0]}")


@app.command("wrap-keys")
def secret_wrap_keys() -> None:
    """Wrap the key file's keys held in clear with the KMS key (secrets_kms_key_id)."""
    from sandhold.config import get_settings
    from sandhold.egress.kms import Kms
    from sandhold.egress.secrets import KeyRing, default_key_file
    from sandhold.errors import SecretKeyError

    s = get_settings()
    try:
        kms = Kms.of(s)
        if kms is None:
            raise SecretKeyError("set secrets_kms_key_id first: the KMS key that wraps them")
        path = s.secrets_key_file or default_key_file(s.data_dir)
        ring = KeyRing.load([], path)  # (as they are: in clear)
        ring.kms = kms
        n = ring.wrap_file()
    except SandholdError as e:
        fail(e)
    console.print(f"wrapped {n} key(s) in {path} with the KMS key {kms.key_id}")


@app.command("new-key")
def secret_new_key() -> None:
    """Print a fresh key for the secrets_keys setting."""
    from sandhold.egress.secrets import new_key

    print(new_key())
