"""Bypass: a host routes one stripe around its upstream on its own, without a leader.

The coordinator's judge demotes a slow host only after it watched it for ``slow_after_s``,
and a fleet without a leader (a takeover, a frozen leader) has no judge at all: meanwhile a
slow host in every stripe's chain throttles everyone behind it, and a dead one stalls them.
Each stripe's assignment therefore names a *bypass peer*, the upstream's own upstream (a
peer of this DC, never the origin), and the bypass peer's assignment names this host among
its *standby* downstreams, so it serves the stripe to it. A host pulls the stripe from the
bypass peer instead of its upstream when that upstream

- is dead or unreachable (``SUSPECT_AFTER`` transport failures in a row; reason ``dead``);
- is the stripe's slow hop by its upload (reason ``tx``): this host receives the stripe at
  under ``SLOW_FRACTION`` x its fastest other stripe fed by a peer, while the upstream says
  (PACE frames, ``relgate_agent.dataplane.transport``) it holds ``AHEAD_MIN`` blocks or more ready for
  this stream: the upstream has the bytes and cannot pass them on, and this host's own
  receive is not the cause (another of its stripes comes in at twice the rate);
- is the slow hop by its receive (reason ``rx``): this host receives the stripe slowly, the
  upstream holds nothing ready, and the upstream says its own upstream holds ``AHEAD_MIN``
  blocks or more ready for it (the PACE's ``fed``). A host sends ``fed`` only while its own
  stripes come in evenly (:meth:`BypassJudge.fed`): a host behind a tx-slow upstream is a
  victim, bypasses that upstream itself, and says nothing that would make its downstreams
  bypass it. The rx rule waits ``RX_HOLD_S``, longer than the tx rule.

Each rule must hold for its hold time over rates measured across ``WINDOW_S``. A bypass
costs little when it is wrong (the bypass peer feeds one more flow; the bypassed host feeds
one fewer) and lasts while the assignment names the same upstream; a new assignment that
names another upstream ends it. Hosts report the stripes they bypass, and the coordinator's
judge leaves those hops out of its evidence (they no longer show the hop it names).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

WINDOW_S = 2.0  # receive rates over this window
TX_HOLD_S = 2.0  # the tx rule holds this long before the upstream is bypassed
RX_HOLD_S = 4.0  # the rx rule (after the tx rule had its chance upstream)
SLOW_FRACTION = 0.5  # under this x the fastest other stripe is slow
AHEAD_MIN = 4  # blocks held ready upstream that make a hop the slow one
FLOOR_BPS = 128 * 1024  # under this reference nothing is judged (a stream ending, paused)
PACE_FRESH_S = 2.0  # an upstream's PACE older than this says nothing
REF_HOLD_S = 10.0  # a stripe's last rate stays a reference this long (after it finished too)

REASON_DEAD = "dead"
REASON_TX = "tx"
REASON_RX = "rx"


@dataclass(frozen=True)
class StripeView:
    """One stripe at one tick, as the judge needs it.

    ``upstream``: the peer it is pulled from now ("" when it is not pulled from a peer: the
    origin, held whole, paused); ``rx``: bytes received on it so far; ``ahead`` / ``fed``:
    the upstream's last fresh PACE (None: none within ``PACE_FRESH_S``); ``can_bypass``:
    the assignment names a bypass peer and the upstream is not bypassed yet."""

    upstream: str
    rx: int
    ahead: int | None = None
    fed: int | None = None
    can_bypass: bool = False


@dataclass(frozen=True)
class Verdict:
    stripe: int
    upstream: str
    reason: str
    rate: float  # this stripe's receive rate over the window (bytes/s)
    reference: float  # the fastest other stripe's
    ahead: int  # what the PACE said (ahead for tx, fed for rx)

    def describe(self) -> str:
        held = "holds" if self.reason == REASON_TX else "is held"
        return (
            f"stripe {self.stripe}: upstream {self.upstream} is the slow hop ({self.reason}): "
            f"{self.rate / 1e6:.2f} MB/s < {SLOW_FRACTION} x {self.reference / 1e6:.2f} MB/s, "
            f"it {held} {self.ahead} blocks ready"
        )


@dataclass
class _Stripe:
    upstream: str = ""
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    tx_since: float | None = None
    rx_since: float | None = None


class BypassJudge:
    """Fed one :class:`StripeView` per stripe each tick; names the upstreams to bypass."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        tx_hold_s: float = TX_HOLD_S,
        rx_hold_s: float = RX_HOLD_S,
    ) -> None:
        self.window_s, self.tx_hold_s, self.rx_hold_s = window_s, tx_hold_s, rx_hold_s
        self._stripes: dict[int, _Stripe] = {}
        self._uneven: set[int] = set()  # stripes slow against this host's own fastest
        # stripe -> (its last rate, when): a reference for the others while REF_HOLD_S lasts,
        # also once it is done (the fast stripes finish first: without it the slow ones
        # would lose their reference just when they are all that is left)
        self._last: dict[int, tuple[float, float]] = {}

    def _rate(self, st: _Stripe, now: float) -> float | None:
        """Bytes/s since the last sample at or before the window's start; None until the
        samples span the window (a new stream)."""
        t0, rx0 = st.samples[0]
        if t0 > now - self.window_s or now <= t0:
            return None
        return (st.samples[-1][1] - rx0) / (now - t0)

    def observe(self, now: float, views: Mapping[int, StripeView]) -> list[Verdict]:
        rates: dict[int, float] = {}
        for s, v in views.items():
            st = self._stripes.setdefault(s, _Stripe())
            if v.upstream != st.upstream:  # another stream: its rate starts over
                self._stripes[s] = st = _Stripe(upstream=v.upstream)
            if not v.upstream:
                continue
            st.samples.append((now, v.rx))
            # keep one sample at or before the window's start, none older
            while len(st.samples) > 1 and st.samples[1][0] <= now - self.window_s:
                st.samples.popleft()
            r = self._rate(st, now)
            if r is not None:
                rates[s] = r
                self._last[s] = (r, now)
        out: list[Verdict] = []
        self._uneven = set()
        for s, r in rates.items():
            v, st = views[s], self._stripes[s]
            others = [o for t, (o, at) in self._last.items() if t != s and now - at <= REF_HOLD_S]
            ref = max(others, default=0.0)
            slow = ref >= FLOOR_BPS and r < SLOW_FRACTION * ref
            if slow:
                self._uneven.add(s)
            tx = slow and v.ahead is not None and v.ahead >= AHEAD_MIN
            rx = (
                slow and not tx and v.ahead is not None and v.fed is not None and v.fed >= AHEAD_MIN
            )
            st.tx_since = (st.tx_since if st.tx_since is not None else now) if tx else None
            st.rx_since = (st.rx_since if st.rx_since is not None else now) if rx else None
            if not v.can_bypass:
                continue
            if st.tx_since is not None and now - st.tx_since >= self.tx_hold_s:
                out.append(Verdict(s, v.upstream, REASON_TX, r, ref, v.ahead or 0))
            elif st.rx_since is not None and now - st.rx_since >= self.rx_hold_s:
                out.append(Verdict(s, v.upstream, REASON_RX, r, ref, v.fed or 0))
        return out

    def fed(self, stripe: int, upstream_ahead: int | None) -> int:
        """What this host's PACE frames say its own upstream holds ready for it on
        ``stripe``: that count while the stripe comes in as fast as this host's others (its
        receive, not its upstream, is what holds it), else 0."""
        if upstream_ahead is None or stripe in self._uneven:
            return 0
        return upstream_ahead


__all__ = [
    "AHEAD_MIN",
    "PACE_FRESH_S",
    "REASON_DEAD",
    "REASON_RX",
    "REASON_TX",
    "SLOW_FRACTION",
    "BypassJudge",
    "StripeView",
    "Verdict",
]
