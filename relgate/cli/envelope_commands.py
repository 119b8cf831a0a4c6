"""``relgate verify-manifest``: check any signed relgate document (a DSSE envelope)."""

from __future__ import annotations

import click

from relgate.cli.common import TRUSTED_HELP, CommandOutput, Ctx, command, pass_ctx, trusted_keys


def register(main: click.Group) -> None:
    @command(main, "verify-manifest")
    @click.argument("envelope_file", type=click.Path(exists=True, dir_okay=False))
    @click.option("--trusted-key", "trusted", multiple=True, help=TRUSTED_HELP)
    @pass_ctx
    def verify_manifest_cmd(
        ctx: Ctx, envelope_file: str, trusted: tuple[str, ...]
    ) -> CommandOutput:
        """Check a signed relgate document (snapshot manifest, release root, report, provenance):
        trusted signature by a key whose role may sign it, strict canonical payload; for
        manifests also the schema and the recomputed digest."""
        from relgate_trust import dsse

        from relgate.documents.release_root import KIND as RELEASE
        from relgate.documents.snapshot_manifest import KIND as SNAPSHOT
        from relgate.integrity.signing import load_envelope, open_verified, relgate_error

        data = load_envelope(envelope_file)
        try:
            peek = dsse.parse_json(data, what="envelope", subject=envelope_file)
        except dsse.DsseError as exc:
            raise relgate_error(exc, envelope_file) from None
        ptype = peek.get("payloadType") if isinstance(peek, dict) else None
        keys = trusted_keys(ctx, trusted)
        verified = open_verified(
            data,
            keys,
            payload_type=ptype if ptype in dsse.PAYLOAD_ROLES else SNAPSHOT.payload_type,
            subject=envelope_file,
        )
        out: dict[str, object] = {
            "valid": True,
            "payloadType": verified.payload_type,
            "signedBy": {
                "keyid": verified.keyid,
                "role": verified.role.value if verified.role else None,
                "version": verified.version,
            },
        }
        for kind in (SNAPSHOT, RELEASE):
            if verified.payload_type == kind.payload_type:
                body = kind.open(data, keys, subject=envelope_file)
                out.update(schema=body["schema"], digest=body[kind.id_field])
        if verified.payload_type == SNAPSHOT.payload_type:
            members = body["members"]
            count = members.get("count") if isinstance(members, dict) else None
            out.update(snapshot=out["digest"], members=count)
        return out
