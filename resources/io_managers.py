"""The code location's I/O manager: local pickles by default, S3 for workers on other hosts.

Dagster hands every asset and op output to the next step through the ``io_manager``
resource.  Left unconfigured it is Dagster's own filesystem pickle manager under the
instance's storage directory (what one machine needs).  With ``s3_bucket`` set it is
dagster-aws's :class:`~dagster_aws.s3.S3PickleIOManager` over an
:class:`~dagster_aws.s3.S3Resource` (``s3_endpoint_url`` for a non-AWS endpoint such as
moto or MinIO), so a step on one celery worker reads what a step on another wrote.
``pipelines.definitions.release_job_celery`` needs the S3 form (docs/deploy.md).
"""

from __future__ import annotations

import dagster as dg


class RelgateIOManager(dg.ConfigurableIOManagerFactory):  # type: ignore[type-arg]  # Dagster's generic factory base
    """``s3_bucket`` empty: pickles under the instance's storage; set: pickles in S3."""

    s3_bucket: str = ""
    s3_prefix: str = "dagster-io"
    s3_endpoint_url: str = ""
    region_name: str = "us-east-1"

    def create_io_manager(self, context: dg.InitResourceContext) -> dg.IOManager:
        if not self.s3_bucket:
            base = context.instance.storage_directory() if context.instance else None
            return dg.FilesystemIOManager(base_dir=base).create_io_manager(context)
        # imported here: dagster_aws costs every process that loads the code location about
        # 0.24 s of imports (a launched run's start), and only the S3 form needs it
        from dagster_aws.s3 import S3PickleIOManager, S3Resource  # noqa: PLC0415

        s3 = S3Resource(endpoint_url=self.s3_endpoint_url or None, region_name=self.region_name)
        return S3PickleIOManager(
            s3_resource=s3, s3_bucket=self.s3_bucket, s3_prefix=self.s3_prefix
        ).create_io_manager(context)
