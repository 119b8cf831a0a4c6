"""Fleet CA commands: ``ca init``, ``ca issue``, ``ca revoke``; the host inventory: ``hosts enroll|list|clear``."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import (
    DEFAULT_COORDINATOR,
    LABELS,
    TlsArgs,
    common,
    operator_client,
    output,
    tls_options,
)


def _cert_json(info: dict[str, object]) -> dict[str, object]:
    return {"notAfter" if k == "not_after" else k: v for k, v in info.items()}


@click.group(
    "ca",
    help="fleet CA: init, issue and revoke role certificates; rotate the CA (status, rotate, promote, retire)",
)
def ca() -> None:
    pass


@ca.command("init", help="create ca.pem / ca.key (0600) in DIR")
@common
@click.option("--dir", "directory", required=True)
@click.option("--force", is_flag=True, help="replace an existing CA")
def ca_init(directory: str, force: bool) -> None:
    from relgate_agent.pki import ca_init as init
    from relgate_agent.pki import cert_info

    path = init(Path(directory), force=force)
    output().emit(
        {"ca": str(path), "key": str(Path(directory) / "ca.key"), **_cert_json(cert_info(path))}
    )


@ca.command("issue", help="issue an operator, coordinator or host certificate")
@common
@click.option("--dir", "directory", required=True, help="the CA directory")
@click.option("--role", required=True, type=click.Choice(["operator", "coordinator", "host"]))
@click.option("--host-id", default="")
@click.option("--rack", default="")
@click.option("--name", default="", help="operator/coordinator name (default: the role)")
@click.option("--validity-hours", type=float, default=72.0)
@click.option("--out-dir", default="", help="where to write <name>.pem/.key (default --dir)")
@click.option("--dns", multiple=True, help="extra DNS SAN (coordinator)")
def ca_issue(
    directory: str,
    role: str,
    host_id: str,
    rack: str,
    name: str,
    validity_hours: float,
    out_dir: str,
    dns: tuple[str, ...],
) -> None:
    from relgate_agent.pki import cert_info, issue

    cert, key = issue(
        Path(directory),
        role,
        host_id=host_id,
        rack=rack,
        name=name,
        validity_h=validity_hours,
        out_dir=Path(out_dir) if out_dir else None,
        extra_dns=tuple(dns),
    )
    output().emit({**_cert_json(cert_info(cert)), "cert": str(cert), "key": str(key)})


@ca.command("revoke", help="revoke a certificate: refused on every call and data handshake")
@common
@click.option("--dir", "directory", required=True, help="the CA directory")
@click.argument("cert")
def ca_revoke(directory: str, cert: str) -> None:
    """Adds the certificate's serial to ``revoked-certs.json`` in the CA directory;
    distribute it with the CA bundle (agents and coordinators re-read it when it changes)."""
    from relgate_agent.identity.certlife import life_of_pem, revoke, serial_hex
    from relgate_agent.pki import PkiError

    try:
        life = life_of_pem(Path(cert).read_bytes())
        path = revoke(Path(directory), life.serial)
    except (OSError, ValueError) as exc:  # not a certificate, or a list we cannot read
        raise PkiError(f"cannot revoke {cert}: {exc}", check="cert-unreadable") from exc
    output().emit({"revoked": serial_hex(life.serial), "subject": life.subject, "list": str(path)})


@click.group("hosts", help="enrolled host inventory")
def hosts() -> None:
    pass


@hosts.command("enroll", help="enroll (or --remove) a host by certificate host id")
@common
@tls_options
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option("--host-id", required=True)
@click.option("--rack", required=True)
@click.option("--labels", type=LABELS, default="")
@click.option("--remove", is_flag=True)
def hosts_enroll(  # noqa: PLR0913 - one parameter per command-line option
    *,
    pki: str,
    ca: str,
    cert: str,
    key: str,
    coordinator: str,
    host_id: str,
    rack: str,
    labels: dict[str, str],
    remove: bool,
) -> None:
    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        enrolled = c.enroll_host(host_id, rack, labels, remove=remove)
    output().emit({"hostId": host_id, "rack": rack, "enrolled": enrolled})


@hosts.command("list", help="enrolled hosts, last heartbeat, health")
@common
@tls_options
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
def hosts_list(pki: str, ca: str, cert: str, key: str, coordinator: str) -> None:
    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        inventory = c.list_hosts()
    output().emit(inventory.to_json())


@hosts.command(
    "revoke",
    help="revoke a host certificate at the coordinator (by --serial, or the one --host-id last"
    " presented): refused on every call and data-plane handshake, cut off from its jobs",
)
@common
@tls_options
@click.option("--serial", default="", help="the certificate's serial number (hex)")
@click.option("--host-id", default="", help="the host whose current certificate to revoke")
@click.option("--reason", default="", help="why (kept with the serial)")
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
def hosts_revoke(
    *,
    serial: str,
    host_id: str,
    reason: str,
    pki: str,
    ca: str,
    cert: str,
    key: str,
    coordinator: str,
) -> None:
    if bool(serial) == bool(host_id):
        raise click.UsageError("give exactly one of --serial and --host-id")
    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.revoke_cert(serial=serial, host_id=host_id, reason=reason)
    output().emit(
        {
            "revoked": r.get("serial"),
            "hostId": r.get("host_id"),
            "added": r.get("added"),
            "leftJobs": r.get("left_jobs", []),
        }
    )


@hosts.command(
    "clear",
    help="clear HOST's health hold (quarantined for bad data, failing handshakes) after a"
    " scrub: it is a target of new jobs again",
)
@common
@tls_options
@click.argument("host_id")
@click.option("--note", required=True, help="what was done (e.g. 'disk replaced, scrubbed')")
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
def hosts_clear(
    host_id: str, note: str, pki: str, ca: str, cert: str, key: str, coordinator: str
) -> None:
    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.clear_host(host_id, note)
    output().emit({"hostId": host_id, "cleared": r.cleared, "was": r.was})
