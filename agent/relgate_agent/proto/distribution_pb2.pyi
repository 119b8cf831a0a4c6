# mypy: ignore-errors
from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class CreateJobRequest(_message.Message):
    __slots__ = (
        "deadline_s",
        "job_id",
        "manifest_uri",
        "model",
        "origin_cap_bytes_per_s",
        "origin_dc",
        "origin_uri",
        "priority",
        "ready_threshold_ppm",
        "stripes",
        "target_selector",
        "version",
        "webhook_url",
    )
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_URI_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_URI_FIELD_NUMBER: _ClassVar[int]
    TARGET_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_CAP_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    READY_THRESHOLD_PPM_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    STRIPES_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_URL_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_DC_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    manifest_uri: str
    origin_uri: str
    target_selector: str
    priority: str
    origin_cap_bytes_per_s: int
    ready_threshold_ppm: int
    deadline_s: int
    stripes: int
    webhook_url: str
    job_id: str
    origin_dc: str
    def __init__(
        self,
        model: str | None = ...,
        version: str | None = ...,
        manifest_uri: str | None = ...,
        origin_uri: str | None = ...,
        target_selector: str | None = ...,
        priority: str | None = ...,
        origin_cap_bytes_per_s: int | None = ...,
        ready_threshold_ppm: int | None = ...,
        deadline_s: int | None = ...,
        stripes: int | None = ...,
        webhook_url: str | None = ...,
        job_id: str | None = ...,
        origin_dc: str | None = ...,
    ) -> None: ...

class CreateJobResponse(_message.Message):
    __slots__ = ("hosts_total", "job_id", "manifest_digest", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    manifest_digest: str
    hosts_total: int
    def __init__(
        self,
        job_id: str | None = ...,
        state: str | None = ...,
        manifest_digest: str | None = ...,
        hosts_total: int | None = ...,
    ) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: str | None = ...) -> None: ...

class HostStatus(_message.Message):
    __slots__ = (
        "bypassed_stripes",
        "chunks_verified",
        "data_refusals",
        "errors",
        "health",
        "host_id",
        "origin_bytes",
        "rack",
        "rx_bytes",
        "rx_bytes_per_s",
        "state",
        "tx_bytes",
    )
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DATA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    BYPASSED_STRIPES_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    state: str
    chunks_verified: int
    rx_bytes: int
    tx_bytes: int
    origin_bytes: int
    rx_bytes_per_s: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    data_refusals: int
    health: str
    bypassed_stripes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        state: str | None = ...,
        chunks_verified: int | None = ...,
        rx_bytes: int | None = ...,
        tx_bytes: int | None = ...,
        origin_bytes: int | None = ...,
        rx_bytes_per_s: int | None = ...,
        errors: _Iterable[str] | None = ...,
        data_refusals: int | None = ...,
        health: str | None = ...,
        bypassed_stripes: _Iterable[int] | None = ...,
    ) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = (
        "bytes_moved",
        "checkpoint_bytes",
        "completion_emitted",
        "control_refusals",
        "duration_s",
        "eta_s",
        "failure",
        "hosts",
        "hosts_ready",
        "hosts_total",
        "job_id",
        "leader_epoch",
        "leader_replica",
        "manifest_digest",
        "model",
        "origin_bytes",
        "pending_events",
        "quarantined_hosts",
        "ready_hosts",
        "removed_hosts",
        "state",
        "straggler_reasons",
        "stragglers",
        "topology_version",
        "version",
    )
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HOSTS_READY_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_EMITTED_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    CONTROL_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    PENDING_EVENTS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEADER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_REASONS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    model: str
    version: str
    manifest_digest: str
    hosts_total: int
    hosts_ready: int
    bytes_moved: int
    origin_bytes: int
    checkpoint_bytes: int
    stragglers: _containers.RepeatedScalarFieldContainer[str]
    eta_s: int
    topology_version: int
    ready_hosts: _containers.RepeatedScalarFieldContainer[str]
    hosts: _containers.RepeatedCompositeFieldContainer[HostStatus]
    completion_emitted: bool
    duration_s: float
    control_refusals: int
    pending_events: int
    quarantined_hosts: _containers.RepeatedScalarFieldContainer[str]
    leader_replica: str
    leader_epoch: int
    failure: str
    straggler_reasons: _containers.RepeatedCompositeFieldContainer[HostReason]
    removed_hosts: _containers.RepeatedCompositeFieldContainer[RemovedHost]
    def __init__(
        self,
        job_id: str | None = ...,
        state: str | None = ...,
        model: str | None = ...,
        version: str | None = ...,
        manifest_digest: str | None = ...,
        hosts_total: int | None = ...,
        hosts_ready: int | None = ...,
        bytes_moved: int | None = ...,
        origin_bytes: int | None = ...,
        checkpoint_bytes: int | None = ...,
        stragglers: _Iterable[str] | None = ...,
        eta_s: int | None = ...,
        topology_version: int | None = ...,
        ready_hosts: _Iterable[str] | None = ...,
        hosts: _Iterable[HostStatus | _Mapping] | None = ...,
        completion_emitted: bool | None = ...,
        duration_s: float | None = ...,
        control_refusals: int | None = ...,
        pending_events: int | None = ...,
        quarantined_hosts: _Iterable[str] | None = ...,
        leader_replica: str | None = ...,
        leader_epoch: int | None = ...,
        failure: str | None = ...,
        straggler_reasons: _Iterable[HostReason | _Mapping] | None = ...,
        removed_hosts: _Iterable[RemovedHost | _Mapping] | None = ...,
    ) -> None: ...

class RemovedHost(_message.Message):
    __slots__ = ("host_id", "reason", "removed_at")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REMOVED_AT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    reason: str
    removed_at: int
    def __init__(
        self, host_id: str | None = ..., reason: str | None = ..., removed_at: int | None = ...
    ) -> None: ...

class HostReason(_message.Message):
    __slots__ = ("host_id", "reason")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    reason: str
    def __init__(self, host_id: str | None = ..., reason: str | None = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: str | None = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("hosts_total", "placed_hosts", "state")
    STATE_FIELD_NUMBER: _ClassVar[int]
    PLACED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    state: str
    placed_hosts: _containers.RepeatedScalarFieldContainer[str]
    hosts_total: int
    def __init__(
        self,
        state: str | None = ...,
        placed_hosts: _Iterable[str] | None = ...,
        hosts_total: int | None = ...,
    ) -> None: ...

class EvictHostRequest(_message.Message):
    __slots__ = ("host_id", "job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    host_id: str
    reason: str
    def __init__(
        self, job_id: str | None = ..., host_id: str | None = ..., reason: str | None = ...
    ) -> None: ...

class EvictHostResponse(_message.Message):
    __slots__ = ("removed", "state")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    state: str
    removed: bool
    def __init__(self, state: str | None = ..., removed: bool | None = ...) -> None: ...

class ClearHostRequest(_message.Message):
    __slots__ = ("host_id", "note")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    note: str
    def __init__(self, host_id: str | None = ..., note: str | None = ...) -> None: ...

class ClearHostResponse(_message.Message):
    __slots__ = ("cleared", "was")
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    WAS_FIELD_NUMBER: _ClassVar[int]
    cleared: bool
    was: str
    def __init__(self, cleared: bool | None = ..., was: str | None = ...) -> None: ...

class EnrollHostRequest(_message.Message):
    __slots__ = ("host_id", "labels", "rack", "remove")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: str | None = ..., value: str | None = ...) -> None: ...

    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    labels: _containers.ScalarMap[str, str]
    remove: bool
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        labels: _Mapping[str, str] | None = ...,
        remove: bool | None = ...,
    ) -> None: ...

class EnrollHostResponse(_message.Message):
    __slots__ = ("enrolled", "host_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ENROLLED_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    enrolled: bool
    def __init__(self, host_id: str | None = ..., enrolled: bool | None = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InventoryHost(_message.Message):
    __slots__ = (
        "data_refusals",
        "enrolled",
        "health",
        "hold",
        "host_id",
        "labels",
        "last_seen_age_s",
        "live",
        "rack",
    )
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: str | None = ..., value: str | None = ...) -> None: ...

    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENROLLED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_S_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DATA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    labels: _containers.ScalarMap[str, str]
    enrolled: bool
    last_seen_age_s: float
    live: bool
    health: str
    data_refusals: int
    hold: str
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        labels: _Mapping[str, str] | None = ...,
        enrolled: bool | None = ...,
        last_seen_age_s: float | None = ...,
        live: bool | None = ...,
        health: str | None = ...,
        data_refusals: int | None = ...,
        hold: str | None = ...,
    ) -> None: ...

class ListHostsResponse(_message.Message):
    __slots__ = ("control_refusals", "hosts")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[InventoryHost]
    control_refusals: int
    def __init__(
        self,
        hosts: _Iterable[InventoryHost | _Mapping] | None = ...,
        control_refusals: int | None = ...,
    ) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    def __init__(self, state: str | None = ...) -> None: ...

class JobSummary(_message.Message):
    __slots__ = (
        "created_at",
        "hosts_ready",
        "hosts_total",
        "job_id",
        "leader_epoch",
        "leader_replica",
        "model",
        "state",
        "version",
    )
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HOSTS_READY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    version: str
    state: str
    hosts_total: int
    hosts_ready: int
    created_at: int
    leader_replica: str
    leader_epoch: int
    def __init__(
        self,
        job_id: str | None = ...,
        model: str | None = ...,
        version: str | None = ...,
        state: str | None = ...,
        hosts_total: int | None = ...,
        hosts_ready: int | None = ...,
        created_at: int | None = ...,
        leader_replica: str | None = ...,
        leader_epoch: int | None = ...,
    ) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobSummary]
    def __init__(self, jobs: _Iterable[JobSummary | _Mapping] | None = ...) -> None: ...

class GetJobTopologyRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: str | None = ...) -> None: ...

class StripeHop(_message.Message):
    __slots__ = ("bypassed", "bytes_done", "downstreams", "host_id", "rx_bytes_per_s", "upstream")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAMS_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYPASSED_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    upstream: str
    downstreams: _containers.RepeatedScalarFieldContainer[str]
    rx_bytes_per_s: int
    bytes_done: int
    bypassed: bool
    def __init__(
        self,
        host_id: str | None = ...,
        upstream: str | None = ...,
        downstreams: _Iterable[str] | None = ...,
        rx_bytes_per_s: int | None = ...,
        bytes_done: int | None = ...,
        bypassed: bool | None = ...,
    ) -> None: ...

class StripeTopology(_message.Message):
    __slots__ = ("hops", "root", "stripe", "stripe_bytes")
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    STRIPE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    stripe: int
    root: str
    stripe_bytes: int
    hops: _containers.RepeatedCompositeFieldContainer[StripeHop]
    def __init__(
        self,
        stripe: int | None = ...,
        root: str | None = ...,
        stripe_bytes: int | None = ...,
        hops: _Iterable[StripeHop | _Mapping] | None = ...,
    ) -> None: ...

class GetJobTopologyResponse(_message.Message):
    __slots__ = ("job_id", "live", "state", "stripes", "topology_version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    STRIPES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    topology_version: int
    live: bool
    stripes: _containers.RepeatedCompositeFieldContainer[StripeTopology]
    def __init__(
        self,
        job_id: str | None = ...,
        state: str | None = ...,
        topology_version: int | None = ...,
        live: bool | None = ...,
        stripes: _Iterable[StripeTopology | _Mapping] | None = ...,
    ) -> None: ...

class CreateEnrollTokenRequest(_message.Message):
    __slots__ = ("host_id", "rack", "ttl_s")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    ttl_s: int
    def __init__(
        self, host_id: str | None = ..., rack: str | None = ..., ttl_s: int | None = ...
    ) -> None: ...

class CreateEnrollTokenResponse(_message.Message):
    __slots__ = ("expires_at", "host_id", "rack", "token")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    token: str
    expires_at: int
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        token: str | None = ...,
        expires_at: int | None = ...,
    ) -> None: ...

class EnrollRequest(_message.Message):
    __slots__ = ("csr_pem", "host_id", "rack", "requested_at")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    csr_pem: str
    requested_at: int
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        csr_pem: str | None = ...,
        requested_at: int | None = ...,
    ) -> None: ...

class ListEnrollRequestsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnrollRequestsResponse(_message.Message):
    __slots__ = ("pending",)
    PENDING_FIELD_NUMBER: _ClassVar[int]
    pending: _containers.RepeatedCompositeFieldContainer[EnrollRequest]
    def __init__(self, pending: _Iterable[EnrollRequest | _Mapping] | None = ...) -> None: ...

class ApproveEnrollmentRequest(_message.Message):
    __slots__ = ("cert_pem", "host_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    cert_pem: str
    def __init__(self, host_id: str | None = ..., cert_pem: str | None = ...) -> None: ...

class ApproveEnrollmentResponse(_message.Message):
    __slots__ = ("host_id", "serial")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    serial: str
    def __init__(self, host_id: str | None = ..., serial: str | None = ...) -> None: ...

class SubmitCsrRequest(_message.Message):
    __slots__ = ("csr_pem", "host_id", "token")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    token: str
    host_id: str
    csr_pem: str
    def __init__(
        self, token: str | None = ..., host_id: str | None = ..., csr_pem: str | None = ...
    ) -> None: ...

class SubmitCsrResponse(_message.Message):
    __slots__ = ("host_id", "rack")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    def __init__(self, host_id: str | None = ..., rack: str | None = ...) -> None: ...

class FetchCertRequest(_message.Message):
    __slots__ = ("host_id", "token")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    token: str
    host_id: str
    def __init__(self, token: str | None = ..., host_id: str | None = ...) -> None: ...

class FetchCertResponse(_message.Message):
    __slots__ = ("approved", "cert_pem")
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    approved: bool
    cert_pem: str
    def __init__(self, approved: bool | None = ..., cert_pem: str | None = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = (
        "data_address",
        "data_refusals",
        "health",
        "held_versions",
        "host_id",
        "known_topology_versions",
        "labels",
        "rack",
    )
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: str | None = ..., value: str | None = ...) -> None: ...

    class KnownTopologyVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: str | None = ..., value: int | None = ...) -> None: ...

    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DATA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_TOPOLOGY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    labels: _containers.ScalarMap[str, str]
    data_address: str
    held_versions: _containers.RepeatedScalarFieldContainer[str]
    health: str
    data_refusals: int
    known_topology_versions: _containers.ScalarMap[str, int]
    def __init__(
        self,
        host_id: str | None = ...,
        rack: str | None = ...,
        labels: _Mapping[str, str] | None = ...,
        data_address: str | None = ...,
        held_versions: _Iterable[str] | None = ...,
        health: str | None = ...,
        data_refusals: int | None = ...,
        known_topology_versions: _Mapping[str, int] | None = ...,
    ) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id", "model", "priority", "state", "version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    version: str
    state: str
    priority: str
    def __init__(
        self,
        job_id: str | None = ...,
        model: str | None = ...,
        version: str | None = ...,
        state: str | None = ...,
        priority: str | None = ...,
    ) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("assignments", "jobs", "sequence")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobRef]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    sequence: int
    def __init__(
        self,
        jobs: _Iterable[JobRef | _Mapping] | None = ...,
        assignments: _Iterable[Assignment | _Mapping] | None = ...,
        sequence: int | None = ...,
    ) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = (
        "data_address",
        "envelope_from_peers",
        "free_disk_bytes",
        "have",
        "host_id",
        "job_id",
        "rack",
        "serving_rate_bytes_per_s",
    )
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SERVING_RATE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FROM_PEERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    host_id: str
    rack: str
    have: bytes
    free_disk_bytes: int
    data_address: str
    serving_rate_bytes_per_s: int
    envelope_from_peers: bool
    def __init__(
        self,
        job_id: str | None = ...,
        host_id: str | None = ...,
        rack: str | None = ...,
        have: bytes | None = ...,
        free_disk_bytes: int | None = ...,
        data_address: str | None = ...,
        serving_rate_bytes_per_s: int | None = ...,
        envelope_from_peers: bool | None = ...,
    ) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = (
        "manifest_digest",
        "manifest_envelope",
        "manifest_sources",
        "origin_uri",
        "stripes",
        "topology_version",
    )
    MANIFEST_ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_URI_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRIPES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SOURCES_FIELD_NUMBER: _ClassVar[int]
    manifest_envelope: bytes
    manifest_digest: str
    origin_uri: str
    topology_version: int
    stripes: int
    manifest_sources: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(
        self,
        manifest_envelope: bytes | None = ...,
        manifest_digest: str | None = ...,
        origin_uri: str | None = ...,
        topology_version: int | None = ...,
        stripes: int | None = ...,
        manifest_sources: _Iterable[Peer | _Mapping] | None = ...,
    ) -> None: ...

class Peer(_message.Message):
    __slots__ = ("address", "host_id", "rack")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    address: str
    rack: str
    def __init__(
        self, host_id: str | None = ..., address: str | None = ..., rack: str | None = ...
    ) -> None: ...

class StripeAssignment(_message.Message):
    __slots__ = (
        "bypass",
        "compress",
        "downstreams",
        "origin_rate_bytes_per_s",
        "resume_block",
        "standby",
        "stripe",
        "upstream",
    )
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAMS_FIELD_NUMBER: _ClassVar[int]
    RESUME_BLOCK_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_RATE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    COMPRESS_FIELD_NUMBER: _ClassVar[int]
    BYPASS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    stripe: int
    upstream: Peer
    downstreams: _containers.RepeatedCompositeFieldContainer[Peer]
    resume_block: int
    origin_rate_bytes_per_s: int
    compress: bool
    bypass: Peer
    standby: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(
        self,
        stripe: int | None = ...,
        upstream: Peer | _Mapping | None = ...,
        downstreams: _Iterable[Peer | _Mapping] | None = ...,
        resume_block: int | None = ...,
        origin_rate_bytes_per_s: int | None = ...,
        compress: bool | None = ...,
        bypass: Peer | _Mapping | None = ...,
        standby: _Iterable[Peer | _Mapping] | None = ...,
    ) -> None: ...

class Assignment(_message.Message):
    __slots__ = (
        "cancelled",
        "job_id",
        "job_state",
        "leader_epoch",
        "members",
        "stripes",
        "topology_version",
    )
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRIPES_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    topology_version: int
    stripes: _containers.RepeatedCompositeFieldContainer[StripeAssignment]
    job_state: str
    cancelled: bool
    members: _containers.RepeatedScalarFieldContainer[str]
    leader_epoch: int
    def __init__(
        self,
        job_id: str | None = ...,
        topology_version: int | None = ...,
        stripes: _Iterable[StripeAssignment | _Mapping] | None = ...,
        job_state: str | None = ...,
        cancelled: bool | None = ...,
        members: _Iterable[str] | None = ...,
        leader_epoch: int | None = ...,
    ) -> None: ...

class ReportError(_message.Message):
    __slots__ = ("chunk", "detail", "from_host", "kind")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FROM_HOST_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    chunk: int
    from_host: str
    detail: str
    def __init__(
        self,
        kind: str | None = ...,
        chunk: int | None = ...,
        from_host: str | None = ...,
        detail: str | None = ...,
    ) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = (
        "bypassed_stripes",
        "data_address",
        "data_refusals",
        "errors",
        "have",
        "health",
        "host_id",
        "job_id",
        "manifest_digest",
        "origin_bytes",
        "placed_manifest_digest",
        "placement_attestation",
        "quiet",
        "rack",
        "ready",
        "rx_bytes",
        "rx_bytes_per_s",
        "seq",
        "stripe_offsets",
        "stripe_rx_bytes_per_s",
        "topology_version",
        "tx_bytes",
        "tx_bytes_per_s",
        "verified_count",
        "verified_delta",
    )
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRIPE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    HAVE_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    PLACED_MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DATA_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_DELTA_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_COUNT_FIELD_NUMBER: _ClassVar[int]
    STRIPE_RX_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BYPASSED_STRIPES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_ATTESTATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    QUIET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    host_id: str
    topology_version: int
    stripe_offsets: _containers.RepeatedScalarFieldContainer[int]
    have: bytes
    rx_bytes: int
    tx_bytes: int
    origin_bytes: int
    rx_bytes_per_s: int
    tx_bytes_per_s: int
    errors: _containers.RepeatedCompositeFieldContainer[ReportError]
    ready: bool
    data_address: str
    rack: str
    placed_manifest_digest: str
    health: str
    data_refusals: int
    verified_delta: bytes
    verified_count: int
    stripe_rx_bytes_per_s: _containers.RepeatedScalarFieldContainer[int]
    manifest_digest: str
    bypassed_stripes: _containers.RepeatedScalarFieldContainer[int]
    placement_attestation: str
    seq: int
    quiet: bool
    def __init__(
        self,
        job_id: str | None = ...,
        host_id: str | None = ...,
        topology_version: int | None = ...,
        stripe_offsets: _Iterable[int] | None = ...,
        have: bytes | None = ...,
        rx_bytes: int | None = ...,
        tx_bytes: int | None = ...,
        origin_bytes: int | None = ...,
        rx_bytes_per_s: int | None = ...,
        tx_bytes_per_s: int | None = ...,
        errors: _Iterable[ReportError | _Mapping] | None = ...,
        ready: bool | None = ...,
        data_address: str | None = ...,
        rack: str | None = ...,
        placed_manifest_digest: str | None = ...,
        health: str | None = ...,
        data_refusals: int | None = ...,
        verified_delta: bytes | None = ...,
        verified_count: int | None = ...,
        stripe_rx_bytes_per_s: _Iterable[int] | None = ...,
        manifest_digest: str | None = ...,
        bypassed_stripes: _Iterable[int] | None = ...,
        placement_attestation: str | None = ...,
        seq: int | None = ...,
        quiet: bool | None = ...,
    ) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("actions", "job_id", "origin_shares", "seq", "topology_version")
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SHARES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    topology_version: int
    actions: _containers.RepeatedScalarFieldContainer[str]
    origin_shares: _containers.RepeatedCompositeFieldContainer[OriginShare]
    seq: int
    job_id: str
    def __init__(
        self,
        topology_version: int | None = ...,
        actions: _Iterable[str] | None = ...,
        origin_shares: _Iterable[OriginShare | _Mapping] | None = ...,
        seq: int | None = ...,
        job_id: str | None = ...,
    ) -> None: ...

class OriginShare(_message.Message):
    __slots__ = ("rate_bytes_per_s", "stripe")
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    RATE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    stripe: int
    rate_bytes_per_s: int
    def __init__(self, stripe: int | None = ..., rate_bytes_per_s: int | None = ...) -> None: ...

class ReportSuspectRequest(_message.Message):
    __slots__ = ("job_id", "reason", "reporter", "stripe", "suspect_host")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_HOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reporter: str
    suspect_host: str
    reason: str
    stripe: int
    def __init__(
        self,
        job_id: str | None = ...,
        reporter: str | None = ...,
        suspect_host: str | None = ...,
        reason: str | None = ...,
        stripe: int | None = ...,
    ) -> None: ...

class ReportSuspectResponse(_message.Message):
    __slots__ = ("new_upstream", "topology_version")
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    topology_version: int
    new_upstream: Peer
    def __init__(
        self, topology_version: int | None = ..., new_upstream: Peer | _Mapping | None = ...
    ) -> None: ...

class FindPeersRequest(_message.Message):
    __slots__ = ("chunk", "exclude", "host_id", "job_id", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    host_id: str
    chunk: int
    exclude: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    def __init__(
        self,
        job_id: str | None = ...,
        host_id: str | None = ...,
        chunk: int | None = ...,
        exclude: _Iterable[str] | None = ...,
        limit: int | None = ...,
    ) -> None: ...

class FindPeersResponse(_message.Message):
    __slots__ = ("holders", "peers")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    holders: int
    def __init__(
        self, peers: _Iterable[Peer | _Mapping] | None = ..., holders: int | None = ...
    ) -> None: ...

class RenewCertRequest(_message.Message):
    __slots__ = ("csr_pem", "host_id", "rack")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    csr_pem: str
    def __init__(
        self, host_id: str | None = ..., rack: str | None = ..., csr_pem: str | None = ...
    ) -> None: ...

class RenewCertResponse(_message.Message):
    __slots__ = ("cert_pem", "serial")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    cert_pem: str
    serial: str
    def __init__(self, cert_pem: str | None = ..., serial: str | None = ...) -> None: ...

class TrustBundleRequest(_message.Message):
    __slots__ = ("have_sha256", "host_id", "rack")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    HAVE_SHA256_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    rack: str
    have_sha256: str
    def __init__(
        self, host_id: str | None = ..., rack: str | None = ..., have_sha256: str | None = ...
    ) -> None: ...

class TrustBundleResponse(_message.Message):
    __slots__ = ("ca_pem", "sha256")
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ca_pem: str
    sha256: str
    def __init__(self, ca_pem: str | None = ..., sha256: str | None = ...) -> None: ...
