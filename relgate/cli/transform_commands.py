"""``relgate transform``: register pinned transform artifacts, tag them, show a pin."""

from __future__ import annotations

from pathlib import Path

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


@click.group()
def transform() -> None:
    """Pinned transforms: wheels and OCI images, and the tags that name them."""


@command(transform, "register")
@click.argument("artifact", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--entry-point",
    default=None,
    help="module:function (a wheel; default: its [relgate.transforms] entry point).",
)
@click.option(
    "--ref",
    "ref_name",
    default=None,
    help="org.opencontainers.image.ref.name to pick (an OCI layout).",
)
@click.option("--tag", default=None, help="Point repository/name:tag at the registered digest.")
@pass_ctx
def transform_register(
    ctx: Ctx, artifact: Path, entry_point: str | None, ref_name: str | None, tag: str | None
) -> CommandOutput:
    """Register a wheel file or an OCI image layout directory (stored, pinned by digest)."""
    from relgate.documents.transform_spec import ImageTransform, WheelTransform
    from relgate.snapshot.transform_tags import tag_transform
    from relgate.transforms.registry import register_image, register_wheel

    ws = ctx.ws()
    spec: WheelTransform | ImageTransform
    if artifact.is_dir():
        spec = register_image(ws.db, ws.cas, artifact, ref_name)
    else:
        spec = register_wheel(ws.db, ws.cas, artifact, entry_point)
    out: dict[str, object] = {"digest": spec.pin, "transform": spec.to_json()}
    if tag:
        out["tag"] = tag
        out["reference"] = f"{tag.rpartition(':')[0]}@{tag_transform(ws.db, tag, spec.pin)}"
    return out


@command(transform, "tag")
@click.argument("tag")
@click.option("--digest", default=None, help="Point the tag at this registered digest.")
@click.option("--builtin", is_flag=True, help="Point it at the built-in code here (tests only).")
@pass_ctx
def transform_tag(ctx: Ctx, tag: str, digest: str | None, builtin: bool) -> CommandOutput:
    """Point a tag at a digest (tags are mutable; builds record the digest)."""
    from relgate.errors import UsageError
    from relgate.snapshot.transform_tags import tag_transform
    from relgate.transforms import refusals

    if bool(digest) == builtin:
        raise UsageError(
            "give exactly one of --digest or --builtin", object=tag, check=refusals.TAG
        )
    return {"tag": tag, "digest": tag_transform(ctx.ws().db, tag, digest)}


@command(transform, "show")
@click.argument("name")
@pass_ctx
def transform_show(ctx: Ctx, name: str) -> CommandOutput:
    """Resolve a tag or reference to its pin and check the stored bytes still match it."""
    from relgate.snapshot.transform_tags import resolve_transform

    ws = ctx.ws()
    ref = resolve_transform(ws.db, name, ws.cas)
    pin = ref.pin()
    return {"reference": str(ref), "digest": ref.digest, "transform": pin.to_json()}


def register(main: click.Group) -> None:
    main.add_command(transform)
