"""relgate-agent command line.

Every command accepts ``--json`` and then prints exactly one JSON object on stdout.
Exit codes: 0 ok, 1 internal error, 2 usage, 3 rejected (validation/verification), 4 conflict.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import grpc

from relgate_agent.client import CoordinatorRefusal
from relgate_agent.errors import AgentError, ManifestError, VerificationError

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_REJECTED, EXIT_CONFLICT = 0, 1, 2, 3, 4

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "kbit": 125,
    "mbit": 125_000,
    "gbit": 125_000_000,
    "kbps": 125,
    "mbps": 125_000,
    "gbps": 125_000_000,
}


def parse_rate(text: str) -> int:
    """Bytes per second from '100Mbit', '12.5MB', '64MiB', '1000000' ('bit'/'bps' are bits)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (e.g. 100Mbit, 50MB, 64MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_size(text: str) -> int:
    return parse_rate(text)


def parse_labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        k, sep, v = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"label {item!r} is not key=value")
        out[k.strip()] = v.strip()
    return out


def _emit(args: argparse.Namespace, obj: dict[str, Any]) -> None:
    if getattr(args, "json", False):
        print(json.dumps(obj, sort_keys=True))
    else:
        for k, v in obj.items():
            print(f"{k}: {v if not isinstance(v, (dict, list)) else json.dumps(v)}")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass


# ---------------------------------------------------------------------------- commands


def _tls(args: argparse.Namespace, name: str) -> Any:
    from relgate_agent.pki import resolve_tls

    return resolve_tls(args.pki, name, args.ca, args.cert, args.key)


def cmd_ca_init(args: argparse.Namespace) -> int:
    from relgate_agent.pki import ca_init, cert_info

    path = ca_init(Path(args.dir), force=args.force)
    _emit(args, {"ca": str(path), "key": str(Path(args.dir) / "ca.key"), **cert_info(path)})
    return EXIT_OK


def cmd_ca_issue(args: argparse.Namespace) -> int:
    from relgate_agent.pki import cert_info, issue

    cert, key = issue(
        Path(args.dir),
        args.role,
        host_id=args.host_id,
        rack=args.rack,
        name=args.name,
        validity_h=args.validity_hours,
        out_dir=Path(args.out_dir) if args.out_dir else None,
        extra_dns=tuple(args.dns),
    )
    _emit(args, {**cert_info(cert), "cert": str(cert), "key": str(key)})
    return EXIT_OK


def cmd_hosts_enroll(args: argparse.Namespace) -> int:
    from relgate_agent.client import CoordinatorClient

    c = CoordinatorClient(args.coordinator, _tls(args, "operator"))
    try:
        enrolled = c.enroll_host(args.host_id, args.rack, args.labels, remove=args.remove)
    finally:
        c.close()
    _emit(args, {"host_id": args.host_id, "rack": args.rack, "enrolled": enrolled})
    return EXIT_OK


def cmd_hosts_list(args: argparse.Namespace) -> int:
    from relgate_agent.client import CoordinatorClient

    c = CoordinatorClient(args.coordinator, _tls(args, "operator"))
    try:
        out = c.list_hosts()
    finally:
        c.close()
    _emit(args, out)
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    from relgate_agent.manifest import generate_private_key, keyid_for, write_keypair

    key = generate_private_key()
    write_keypair(key, Path(args.private), Path(args.public))
    _emit(
        args, {"keyid": keyid_for(key.public_key()), "private": args.private, "public": args.public}
    )
    return EXIT_OK


def cmd_manifest_build(args: argparse.Namespace) -> int:
    from relgate_agent.manifest import (
        build_manifest,
        load_private_key,
        sign_manifest,
        write_envelope,
    )

    m = build_manifest(args.directory, args.model, args.version, args.chunk_size, args.block_size)
    env = sign_manifest(m, load_private_key(args.key))
    write_envelope(env, args.out)
    _emit(
        args,
        {
            "manifest_digest": m.digest,
            "chunks": m.num_chunks,
            "total_size": m.total_size,
            "envelope": args.out,
        },
    )
    return EXIT_OK


def cmd_manifest_verify(args: argparse.Namespace) -> int:
    from relgate_agent.manifest import verify_envelope
    from relgate_agent.origin import read_uri

    m = verify_envelope(read_uri(args.envelope), args.trusted_keys)
    _emit(
        args,
        {
            "manifest_digest": m.digest,
            "model": m.model,
            "version": m.version,
            "total_size": m.total_size,
        },
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Scrub a placed copy against its signed manifest; un-place it on any mismatch."""
    from relgate_agent.fstree import UnsafePathError
    from relgate_agent.manifest import TrustedKeys, validate_name, verify_envelope
    from relgate_agent.storage import (
        CHECK_CHUNK_DIGEST,
        CHECK_NOT_PLACED,
        CHECK_PLACED_MANIFEST,
        CHECK_PLACED_MARKER,
        VersionStore,
        read_placed_envelope,
        read_placed_marker,
        scrub_placed,
        unplace,
    )

    root = Path(args.models_root)
    model, version = validate_name("model", args.model), validate_name("version", args.version)
    obj = f"{model}/{version}"

    def refuse(check: str, message: str, **extra: Any) -> int:
        _emit(
            args, {"error": "rejected", "object": obj, "check": check, "message": message, **extra}
        )
        return EXIT_REJECTED

    if not VersionStore.is_placed(root, model, version):
        return refuse(CHECK_NOT_PLACED, f"{root / model / version} is not a placed copy")
    envelope = read_placed_envelope(root, model, version)
    if envelope is None:
        return refuse(CHECK_PLACED_MANIFEST, "no signed manifest recorded beside the placed copy")
    manifest = verify_envelope(envelope, TrustedKeys.load(args.trusted_keys))
    marker = read_placed_marker(root, model, version)
    if (manifest.model, manifest.version) != (model, version) or marker != manifest.digest:
        return refuse(
            CHECK_PLACED_MARKER,
            f"placed marker {marker!r} does not record manifest {manifest.digest}",
            digest=manifest.digest,
        )
    try:
        result = scrub_placed(root, manifest)
    except UnsafePathError as exc:
        if not args.keep:
            unplace(root, model, version)
        return refuse(
            exc.check, str(exc), path=exc.path, digest=manifest.digest, unplaced=not args.keep
        )
    if result.intact:
        _emit(
            args,
            {
                "object": obj,
                "intact": True,
                "manifest_digest": manifest.digest,
                "chunks": result.chunks,
                "path": str(root / model / version),
            },
        )
        return EXIT_OK
    if not args.keep:
        unplace(root, model, version)
    chunk = result.bad_chunks[0]
    return refuse(
        CHECK_CHUNK_DIGEST,
        f"chunk {chunk} of {', '.join(result.files_of_first_bad)} does not match the manifest "
        f"(expected {result.expected_digest}, got {result.actual_digest})",
        chunk=chunk,
        file=result.files_of_first_bad[0],
        files=list(result.files_of_first_bad),
        expected=result.expected_digest,
        actual=result.actual_digest,
        bad_chunks=list(result.bad_chunks),
        digest=manifest.digest,
        unplaced=not args.keep,
    )


def cmd_coordinator_serve(args: argparse.Namespace) -> int:
    from relgate_agent.coordinator.server import CoordinatorServer
    from relgate_agent.coordinator.service import CoordinatorConfig, default_db_path
    from relgate_agent.manifest import TrustedKeys

    _setup_logging(args.verbose)
    cfg = CoordinatorConfig(
        db=args.db or default_db_path(),
        trusted_keys=TrustedKeys.load(args.trusted_keys),
        default_stripes=args.stripes,
        dead_after_s=args.dead_after,
        report_interval_s=args.report_interval,
        webhook_url=args.webhook or "",
        ha=args.ha,
        splice_on_suspect=not args.no_splice_on_suspect,
        lease_ttl_s=args.lease_ttl,
        replica_id=args.replica_id,
        host_ttl_s=args.host_ttl,
    )
    server = CoordinatorServer(
        cfg, args.listen or ["127.0.0.1:7470"], tls=_tls(args, "coordinator")
    ).start()
    if args.address_file:
        Path(args.address_file).write_text(server.address)
    _emit(args, {"listening": server.address, "addresses": server.addresses, "pid": os.getpid()})
    sys.stdout.flush()
    try:
        _wait_for_signal()
    finally:
        server.stop()
    return EXIT_OK


def cmd_agent_serve(args: argparse.Namespace) -> int:
    from relgate_agent.agent.host import HostAgent
    from relgate_agent.agent.job import AgentConfig
    from relgate_agent.manifest import TrustedKeys

    _setup_logging(args.verbose)
    host, _, port = args.listen.rpartition(":")
    cfg = AgentConfig(
        host_id=args.host_id,
        rack=args.rack,
        coordinator=args.coordinator,
        models_root=Path(args.models_root),
        trusted_keys=TrustedKeys.load(args.trusted_keys),
        labels=args.labels,
        listen_host=host or "127.0.0.1",
        listen_port=int(port or 0),
        advertise_host=args.advertise or "",
        journal_interval_s=args.journal_interval,
        report_interval_s=args.report_interval,
        retain_versions=args.retain,
        max_rate_bytes_per_s=args.max_rate,
    )
    from relgate_agent.transport import DataPlaneLimits

    limits = DataPlaneLimits(
        handshake_timeout_s=args.handshake_timeout,
        request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout,
        max_conns_total=args.max_conns,
        max_conns_per_peer=args.max_conns_per_peer,
        max_handshaking_per_address=args.max_handshaking_per_address,
    )
    agent = HostAgent(cfg, tls=_tls(args, args.host_id), limits=limits).start()
    _emit(args, {"host_id": cfg.host_id, "data_address": agent.data_address, "pid": os.getpid()})
    sys.stdout.flush()
    try:
        _wait_for_signal()
    finally:
        agent.stop()
    return EXIT_OK


def cmd_job_create(args: argparse.Namespace) -> int:
    from relgate_agent.client import CoordinatorClient

    c = CoordinatorClient(args.coordinator, _tls(args, "operator"))
    try:
        r = c.create_job(
            model=args.model,
            version=args.version,
            manifest_uri=args.manifest_uri,
            origin_uri=args.origin_uri or "",
            target_selector=args.selector,
            priority=args.priority,
            origin_cap_bytes_per_s=args.origin_cap,
            ready_threshold_ppm=round(args.ready_threshold * 1_000_000),
            deadline_s=args.deadline,
            stripes=args.stripes,
            webhook_url=args.webhook or "",
            job_id=args.job_id or "",
        )
    finally:
        c.close()
    _emit(
        args,
        {
            "job_id": r.job_id,
            "state": r.state,
            "manifest_digest": r.manifest_digest,
            "hosts_total": r.hosts_total,
        },
    )
    return EXIT_OK


def cmd_job_get(args: argparse.Namespace) -> int:
    from relgate_agent.client import CoordinatorClient, job_to_dict

    c = CoordinatorClient(args.coordinator, _tls(args, "operator"))
    try:
        status = job_to_dict(c.get_job(args.job_id))
    finally:
        c.close()
    if not args.hosts:
        status.pop("hosts")
    _emit(args, status)
    return EXIT_OK


def cmd_job_cancel(args: argparse.Namespace) -> int:
    from relgate_agent.client import CoordinatorClient

    c = CoordinatorClient(args.coordinator, _tls(args, "operator"))
    try:
        c.cancel_job(args.job_id)
    finally:
        c.close()
    _emit(args, {"job_id": args.job_id, "state": "CANCELLED"})
    return EXIT_OK


def cmd_lab_up(args: argparse.Namespace) -> int:
    from relgate_agent.lab import LabSpec, lab_up

    _setup_logging(args.verbose)
    spec = LabSpec(
        hosts=args.hosts,
        racks=args.racks,
        nic_bytes_per_s=args.nic,
        state_dir=Path(args.state_dir),
        trusted_keys=[str(p) for p in args.trusted_keys],
        coordinator_listen=args.coordinator_listen,
        journal_interval_s=args.journal_interval,
        force_loopback=args.loopback,
    )
    info = lab_up(spec)
    _emit(args, info)
    return EXIT_OK


def cmd_lab_down(args: argparse.Namespace) -> int:
    from relgate_agent.lab import lab_down

    _emit(args, lab_down(Path(args.state_dir)))
    return EXIT_OK


def cmd_lab_origin_serve(args: argparse.Namespace) -> int:
    from relgate_agent.lab import serve_origin

    host, _, port = args.listen.rpartition(":")
    serve_origin(Path(args.dir), host or "127.0.0.1", int(port or 0))
    return EXIT_OK


def cmd_pipes(args: argparse.Namespace) -> int:
    from relgate_agent.pipes import run_pipes

    _setup_logging(args.verbose)
    return run_pipes()


# ---------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relgate-agent", description=__doc__)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        sp.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)

    def tls(sp: argparse.ArgumentParser) -> None:
        g = sp.add_argument_group("mutual TLS (fleet CA)")
        g.add_argument(
            "--pki",
            default="",
            help="PKI directory: ca.pem + <name>.pem/.key (default $RELGATE_AGENT_PKI)",
        )
        g.add_argument("--ca", default="", help="CA certificate (overrides --pki)")
        g.add_argument("--cert", default="", help="this identity's certificate")
        g.add_argument("--key", default="", help="this identity's private key")

    ca = sub.add_parser("ca", help="fleet CA: init, issue role certificates").add_subparsers(
        dest="sub", required=True
    )
    ci = ca.add_parser("init", help="create ca.pem / ca.key (0600) in DIR")
    common(ci)
    ci.add_argument("--dir", required=True)
    ci.add_argument("--force", action="store_true", help="replace an existing CA")
    ci.set_defaults(fn=cmd_ca_init)
    cis = ca.add_parser("issue", help="issue an operator, coordinator or host certificate")
    common(cis)
    cis.add_argument("--dir", required=True, help="the CA directory")
    cis.add_argument("--role", required=True, choices=["operator", "coordinator", "host"])
    cis.add_argument("--host-id", default="")
    cis.add_argument("--rack", default="")
    cis.add_argument("--name", default="", help="operator/coordinator name (default: the role)")
    cis.add_argument("--validity-hours", type=float, default=72.0)
    cis.add_argument("--out-dir", default="", help="where to write <name>.pem/.key (default --dir)")
    cis.add_argument("--dns", action="append", default=[], help="extra DNS SAN (coordinator)")
    cis.set_defaults(fn=cmd_ca_issue)

    hs = sub.add_parser("hosts", help="enrolled host inventory").add_subparsers(
        dest="sub", required=True
    )
    he = hs.add_parser("enroll", help="enroll (or --remove) a host by certificate host id")
    common(he)
    tls(he)
    he.add_argument("--coordinator", default="127.0.0.1:7470")
    he.add_argument("--host-id", required=True)
    he.add_argument("--rack", required=True)
    he.add_argument("--labels", type=parse_labels, default={})
    he.add_argument("--remove", action="store_true")
    he.set_defaults(fn=cmd_hosts_enroll)
    hl = hs.add_parser("list", help="enrolled hosts, last heartbeat, health")
    common(hl)
    tls(hl)
    hl.add_argument("--coordinator", default="127.0.0.1:7470")
    hl.set_defaults(fn=cmd_hosts_list)

    kg = sub.add_parser("keygen", help="generate an Ed25519 key pair (PEM PKCS8 / SPKI)")
    common(kg)
    kg.add_argument("--private", required=True)
    kg.add_argument("--public", required=True)
    kg.set_defaults(fn=cmd_keygen)

    man = sub.add_parser(
        "manifest", help="build/sign or verify a checkpoint manifest"
    ).add_subparsers(dest="sub", required=True)
    mb = man.add_parser(
        "build", help="hash a checkpoint directory and write a signed DSSE envelope"
    )
    common(mb)
    mb.add_argument("directory")
    mb.add_argument("--model", required=True)
    mb.add_argument("--version", required=True)
    mb.add_argument("--chunk-size", type=parse_size, default=64 * 1024 * 1024)
    mb.add_argument("--block-size", type=parse_size, default=4 * 1024 * 1024)
    mb.add_argument("--key", required=True, help="PEM PKCS8 Ed25519 private key")
    mb.add_argument("--out", required=True)
    mb.set_defaults(fn=cmd_manifest_build)
    mv = man.add_parser("verify")
    common(mv)
    mv.add_argument("envelope")
    mv.add_argument("--trusted-keys", nargs="+", required=True)
    mv.set_defaults(fn=cmd_manifest_verify)

    vf = sub.add_parser(
        "verify", help="scrub a placed copy against its signed manifest; un-place on mismatch"
    )
    common(vf)
    vf.add_argument("model")
    vf.add_argument("version")
    vf.add_argument("--models-root", default="/models")
    vf.add_argument("--trusted-keys", nargs="+", required=True)
    vf.add_argument("--keep", action="store_true", help="report a mismatch but do not un-place")
    vf.set_defaults(fn=cmd_verify)

    co = sub.add_parser("coordinator").add_subparsers(dest="sub", required=True)
    cs = co.add_parser("serve", help="run the coordinator (gRPC)")
    common(cs)
    cs.add_argument(
        "--listen",
        action="append",
        default=[],
        help="host:port or unix:/path (repeatable; default 127.0.0.1:7470)",
    )
    cs.add_argument("--db", default="", help="SQLite path or postgresql:// DSN")
    cs.add_argument("--trusted-keys", nargs="+", required=True)
    cs.add_argument("--stripes", type=int, default=8)
    cs.add_argument("--dead-after", type=float, default=6.0)
    cs.add_argument("--report-interval", type=float, default=1.0)
    cs.add_argument("--webhook", default="")
    cs.add_argument("--address-file", default="")
    cs.add_argument(
        "--ha", action="store_true", help="replica mode: lead only while holding the lease in --db"
    )
    cs.add_argument("--lease-ttl", type=float, default=10.0)
    cs.add_argument(
        "--no-splice-on-suspect",
        action="store_true",
        help="splice only after --dead-after (agents fall back to swarm repair meanwhile)",
    )
    cs.add_argument("--replica-id", default="")
    cs.add_argument(
        "--host-ttl",
        type=float,
        default=60.0,
        help="enrolled hosts without a heartbeat for this long are not targets",
    )
    tls(cs)
    cs.set_defaults(fn=cmd_coordinator_serve)

    ag = sub.add_parser("agent").add_subparsers(dest="sub", required=True)
    aserve = ag.add_parser("serve", help="run the host agent")
    common(aserve)
    aserve.add_argument("--host-id", required=True)
    aserve.add_argument("--rack", required=True)
    aserve.add_argument("--labels", type=parse_labels, default={})
    aserve.add_argument("--coordinator", required=True)
    aserve.add_argument("--models-root", default="/models")
    aserve.add_argument("--trusted-keys", nargs="+", required=True)
    aserve.add_argument("--listen", default="127.0.0.1:0")
    aserve.add_argument("--advertise", default="")
    aserve.add_argument("--journal-interval", type=float, default=2.0)
    aserve.add_argument("--report-interval", type=float, default=1.0)
    aserve.add_argument(
        "--retain", type=int, default=2, help="placed versions kept per model (2 = N-1)"
    )
    aserve.add_argument(
        "--max-rate",
        type=parse_rate,
        default=0,
        help="cap distribution rx and tx on this host (e.g. 20Gbit) so serving traffic keeps its share",
    )
    aserve.add_argument("--handshake-timeout", type=float, default=5.0)
    aserve.add_argument("--request-timeout", type=float, default=5.0)
    aserve.add_argument("--idle-timeout", type=float, default=30.0)
    aserve.add_argument("--max-conns", type=int, default=512)
    aserve.add_argument("--max-conns-per-peer", type=int, default=32)
    aserve.add_argument("--max-handshaking-per-address", type=int, default=64)
    tls(aserve)
    aserve.set_defaults(fn=cmd_agent_serve)

    job = sub.add_parser("job").add_subparsers(dest="sub", required=True)
    jc = job.add_parser("create")
    common(jc)
    jc.add_argument("--coordinator", default="127.0.0.1:7470")
    jc.add_argument("--model", required=True)
    jc.add_argument("--version", required=True)
    jc.add_argument("--manifest-uri", required=True)
    jc.add_argument("--origin-uri", default="")
    jc.add_argument("--selector", default="")
    jc.add_argument("--priority", default="normal", choices=["low", "normal", "high"])
    jc.add_argument("--origin-cap", type=parse_rate, default=0)
    jc.add_argument("--ready-threshold", type=float, default=0.995)
    jc.add_argument("--deadline", type=int, default=0)
    jc.add_argument("--stripes", type=int, default=0)
    jc.add_argument("--webhook", default="")
    jc.add_argument("--job-id", default="")
    tls(jc)
    jc.set_defaults(fn=cmd_job_create)
    jg = job.add_parser("get")
    common(jg)
    jg.add_argument("job_id")
    jg.add_argument("--coordinator", default="127.0.0.1:7470")
    jg.add_argument("--hosts", action="store_true", help="include per-host status")
    tls(jg)
    jg.set_defaults(fn=cmd_job_get)
    jx = job.add_parser("cancel")
    common(jx)
    jx.add_argument("job_id")
    jx.add_argument("--coordinator", default="127.0.0.1:7470")
    tls(jx)
    jx.set_defaults(fn=cmd_job_cancel)

    lab = sub.add_parser("lab").add_subparsers(dest="sub", required=True)
    lu = lab.add_parser("up", help="netns lab: one namespace per host, a bridge per rack, tbf caps")
    common(lu)
    lu.add_argument("--hosts", type=int, default=8)
    lu.add_argument("--racks", type=int, default=2)
    lu.add_argument("--nic", type=parse_rate, default=parse_rate("100Mbit"))
    lu.add_argument("--state-dir", default="var/lab")
    lu.add_argument("--trusted-keys", nargs="+", required=True)
    lu.add_argument("--coordinator-listen", default="")
    lu.add_argument("--journal-interval", type=float, default=2.0)
    lu.add_argument("--loopback", action="store_true", help="no namespaces even when root")
    lu.set_defaults(fn=cmd_lab_up)
    ld = lab.add_parser("down")
    common(ld)
    ld.add_argument("--state-dir", default="var/lab")
    ld.set_defaults(fn=cmd_lab_down)
    lo = lab.add_parser("origin-serve", help="ranged-GET HTTP origin (object-store stand-in)")
    common(lo)
    lo.add_argument("--dir", required=True)
    lo.add_argument("--listen", default="127.0.0.1:0")
    lo.set_defaults(fn=cmd_lab_origin_serve)

    pp = sub.add_parser(
        "pipes", help="run a distribution job under Dagster Pipes (open_dagster_pipes)"
    )
    common(pp)
    pp.set_defaults(fn=cmd_pipes)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    try:
        return int(args.fn(args))
    except (VerificationError, ManifestError) as exc:
        _emit(args, {"error": "rejected", "message": str(exc), "check": getattr(exc, "check", "")})
        return EXIT_REJECTED
    except grpc.RpcError as exc:
        code = exc.code()
        _emit(args, {"error": code.name.lower(), "message": exc.details()})
        if code in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ):
            return EXIT_REJECTED
        if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.ALREADY_EXISTS):
            return EXIT_CONFLICT
        return EXIT_INTERNAL
    except CoordinatorRefusal as exc:
        _emit(args, exc.to_json())
        return EXIT_REJECTED
    except AgentError as exc:
        _emit(args, {"error": "rejected", "message": str(exc)})
        return EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
