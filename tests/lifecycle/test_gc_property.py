"""Property (issue 28, item 4): after any sequence of register / tag / configure / build /
release / publish / retire / sweep operations on a real SQLite workspace, every command that
worked before a sweep still works after it.

The commands probed: resolving each tag with its stored bytes checked (``transform show``,
the next build), re-registering each wheel (``demo seed``), reading each registered
tokenizer, the workspace config's transform, a proof against every catalogued snapshot
and release (``prove`` / ``check-proof``: signed manifest and membership table), and every
retained version verified end to end.  Few examples, short sequences: a few seconds."""

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import transforms as art
from support.lifecycle import publish, release_of, set_state
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.lifecycle.collector import sweep, verify_retained
from relgate.objects.layout import cas_key
from relgate.release import proofs
from relgate.snapshot import tokenizer
from relgate.snapshot.transform_tags import resolve_transform, tag_transform
from relgate.transforms.registry import register_wheel

OPS = ("wheel", "tag", "configure", "tokenizer", "build", "release", "publish", "retire", "sweep")
WHEELS = 2
BUILTIN = "registry.local/normalize:v1"


class World:
    """A workspace and what the operations made in it."""

    def __init__(self, home: Path, scratch: Path) -> None:
        self.ws = make_workspace(home)
        self.wheels = [
            art.write_wheel(scratch, f"t-prop{i}", "1.0", art.IDENTITY) for i in range(WHEELS)
        ]
        self.pins: dict[int, str] = {}
        self.tags: dict[str, str] = {}
        self.tokenizers: list[str] = []
        self.snapshots: list[str] = []
        self.releases: list[str] = []  # STAGED, not yet published or retired
        self.used: set[str] = set()
        self.step = 0

    def apply(self, op: str) -> None:
        ws, self.step = self.ws, self.step + 1
        slot = self.step % WHEELS
        if op == "wheel":
            self.pins[slot] = register_wheel(ws.db, ws.cas, self.wheels[slot]).pin
        elif op == "tag" and slot in self.pins:
            tag = f"registry.local/prop{slot}:v{self.step}"
            self.tags[tag] = tag_transform(ws.db, tag, self.pins[slot])
        elif op == "configure" and self.tags:
            ws.config.setdefault("snapshot", {})["transform"] = sorted(self.tags)[-1]
            ws.save()
        elif op == "tokenizer":
            texts = [f"w{self.step} x{i} y z" for i in range(20)]
            self.tokenizers.append(tokenizer.register(ws, tokenizer.train(texts, vocab_size=280)))
        elif op == "build":  # the built-in transform: fast, and the wheels stay unused
            self.snapshots.append(build_approved(ws, transform=BUILTIN).digest)
        elif op == "release" and self.snapshots:
            digest = release_of(ws, self.snapshots[-1]).digest
            if digest not in self.used:  # the same snapshot again: the same release
                self.releases.append(digest)
                self.used.add(digest)
        elif op == "publish" and self.releases:
            publish(ws, self.releases.pop(), "train")
        elif op == "retire" and self.releases:
            set_state(ws, "release", self.releases.pop(), "INVALID")
        elif op == "sweep":
            self.check_sweep()

    def probes(self) -> dict[str, object]:
        ws = self.ws
        out: dict[str, object] = {}
        calls = {f"transform show {t}": (resolve_transform, (ws.db, t, ws.cas)) for t in self.tags}
        calls |= {
            f"register wheel {i}": (register_wheel, (ws.db, ws.cas, w))
            for i, w in enumerate(self.wheels)
            if i in self.pins
        }
        calls |= {
            f"tokenizer {d}": (lambda d: ws.cas.get(d, ws.store.head(cas_key(d)).version_id), (d,))
            for d in self.tokenizers
        }
        calls["configured transform"] = (
            lambda: resolve_transform(ws.db, str(ws.config["snapshot"]["transform"]), ws.cas),
            (),
        )
        with ws.db.tx() as conn:
            snaps = [r[0] for r in conn.exec_driver_sql("SELECT digest FROM snapshots")]
            rels = [r[0] for r in conn.exec_driver_sql("SELECT digest FROM releases")]
        for d in snaps:
            calls[f"prove snapshot {d}"] = (self._prove, ("snapshot", d))
        for d in rels:
            calls[f"prove release {d}"] = (self._prove, ("release", d))
        calls["verify retained"] = (verify_retained, (ws,))
        for name, (fn, args) in calls.items():  # fmt: skip
            try:
                fn(*args)
                out[name] = True
            except Exception as exc:
                out[name] = exc
        return out

    def _prove(self, kind: str, digest: str) -> None:
        subject = (
            {"snapshot": digest, "release": None}
            if kind == "snapshot"
            else {"snapshot": None, "release": digest}
        )
        proofs.bundle(self.ws, "no-such-sample", **subject).check(self.ws.trusted_keys)

    def check_sweep(self) -> None:
        before = self.probes()
        sweep(self.ws, actor="gc", grace_seconds=0)
        after = self.probes()
        broken = {n: after[n] for n, ok in before.items() if ok is True and after[n] is not True}
        assert not broken, broken


@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(st.sampled_from(OPS), min_size=4, max_size=8))
def test_a_sweep_breaks_nothing_that_worked(ops):
    with tempfile.TemporaryDirectory(prefix="relgate-gc-prop-") as scratch:
        world = World(Path(scratch) / "home", Path(scratch))
        try:
            for op in ["wheel", "tag", "build", "release", *ops, "sweep"]:
                world.apply(op)
        finally:
            world.ws.close()
