"""The ``verify-handoff`` command: check a deployer event and every placement attestation."""

from __future__ import annotations

import sys

import click

from relgate_agent.cli.params import common, output

EXIT_OK, EXIT_REJECTED = 0, 3


@click.command(
    "verify-handoff",
    help="verify a deployer event (DistributionComplete / HostsReady): the coordinator's "
    "signature and every READY host's placement attestation, against the fleet CA; prints "
    "the hosts removed from the job with why and when",
)
@common
@click.argument("event")
@click.option("--ca", "ca_path", required=True, help="the fleet CA certificate (PEM)")
def verify_handoff(event: str, ca_path: str) -> int:
    """EVENT is the webhook body as received (a file, or - for stdin)."""
    from relgate_agent.attestation import (
        MAX_EVENT_BYTES,
        HandoffError,
        load_ca,
        removed_hosts,
        verify_event_bytes,
    )
    from relgate_agent.dataplane.manifestread import read_manifest

    ca = load_ca(ca_path)
    raw = (
        sys.stdin.buffer.read(MAX_EVENT_BYTES + 1)
        if event == "-"
        else read_manifest(event, max_bytes=MAX_EVENT_BYTES)  # bounded, regular files only
    )
    try:
        body = verify_event_bytes(raw, ca)
    except HandoffError as exc:
        output().emit(exc.to_json())
        return EXIT_REJECTED
    ready = body.get("readyHosts") or []
    output().emit(
        {
            "verified": True,
            "type": body.get("type"),
            "eventId": body.get("eventId"),
            "job": body.get("job"),
            "manifestDigest": body.get("manifestDigest"),
            "hostsAttested": len(ready),
            # targets the job no longer waits for, with why and when (signed with the event)
            "removedHosts": [r.to_json() for r in removed_hosts(body)],
        }
    )
    return EXIT_OK
