"""Signing commands: ``keygen``, ``manifest build``, ``manifest verify``."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import SIZE, common, output

MiB = 1024 * 1024


@click.command(
    "keygen",
    help="generate an Ed25519 builder key pair (PEM PKCS8 / SPKI) for signing checkpoint "
    "manifests, atomically; a complete pair is refused (exit 3) unless --force, a "
    "half-written one is completed or replaced",
)
@common
@click.option("--private", "private_path", required=True)
@click.option(
    "--public",
    "public_path",
    required=True,
    help="a directory (builder-v1.pem is written in it) or a file named "
    "builder-v<N>[-<anything>].pem; any other name is refused (exit 2)",
)
@click.option("--force", is_flag=True, help="replace an existing pair (a key rotation)")
def keygen(private_path: str, public_path: str, force: bool) -> None:
    from relgate_agent.identity.keypair import PublicKeyNameError, create_keypair, public_key_path

    try:
        public = public_key_path(public_path)
    except PublicKeyNameError as exc:
        raise click.BadParameter(str(exc), param_hint="'--public'") from None
    outcome = create_keypair(Path(private_path), public, force=force)
    output().emit(outcome.to_json())


@click.group("manifest", help="build/sign or verify a checkpoint manifest")
def manifest() -> None:
    pass


@manifest.command("build", help="hash a checkpoint directory and write a signed DSSE envelope")
@common
@click.argument("directory")
@click.option("--model", required=True)
@click.option("--version", required=True)
@click.option("--chunk-size", type=SIZE, default=64 * MiB)
@click.option("--block-size", type=SIZE, default=4 * MiB)
@click.option("--key", required=True, help="PEM PKCS8 Ed25519 private key")
@click.option("--out", required=True)
def manifest_build(
    directory: str, model: str, version: str, chunk_size: int, block_size: int, key: str, out: str
) -> None:
    from relgate_trust.manifest import (
        build_manifest,
        load_private_key,
        sign_manifest,
        write_envelope,
    )

    m = build_manifest(directory, model, version, chunk_size, block_size)
    write_envelope(sign_manifest(m, load_private_key(key)), out)
    output().emit(
        {
            "manifestDigest": m.digest,
            "chunks": m.num_chunks,
            "totalSize": m.total_size,
            "envelope": out,
        }
    )


@manifest.command("verify")
@common
@click.argument("envelope")
@click.option("--trusted-keys", required=True, multiple=True)
def manifest_verify(envelope: str, trusted_keys: tuple[str, ...]) -> None:
    from relgate_trust.manifest import verify_envelope

    from relgate_agent.dataplane.manifestread import read_manifest

    # bounded, regular files only, with a deadline: a FIFO or /dev/zero is refused (exit 3)
    m = verify_envelope(read_manifest(envelope), list(trusted_keys))
    output().emit(
        {
            "manifestDigest": m.digest,
            "model": m.model,
            "version": m.version,
            "totalSize": m.total_size,
        }
    )
