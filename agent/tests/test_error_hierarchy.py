"""One exception hierarchy: every exception the agent and the shared trust package define
is an AgentError (rooted at relgate_trust.errors.TrustError).

Walks every module of relgate_agent and relgate_trust (the generated protobuf code and the
``__main__`` entry points aside) and checks each Exception subclass defined there. The private control-flow
exceptions that never leave their module are the only ones outside the hierarchy.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import relgate_trust

import relgate_agent
from relgate_agent.errors import AgentError

#: raised and caught inside one function or module, never seen by a caller
PRIVATE_CONTROL_FLOW = frozenset(
    {
        "relgate_agent.agent.stripes._JobOver",  # a stripe worker's loop ends
        "relgate_trust.dsse._Refuse",  # json.loads hooks -> DsseError in parse_json
    }
)


def _modules() -> list[str]:
    return sorted(
        info.name
        for package in (relgate_agent, relgate_trust)
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
        if not info.name.startswith("relgate_agent.proto") and not info.name.endswith(".__main__")
    )


def _exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in ["relgate_agent", "relgate_trust", *_modules()]:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_the_walk_sees_the_packages_and_their_exceptions() -> None:
    modules = _modules()
    for package in ("agent", "coordinator", "dataplane", "identity", "staging", "sim", "cli"):
        assert f"relgate_agent.{package}" in modules
    names = set(_exceptions())
    assert "relgate_agent.dataplane.transport.TransportError" in names
    assert "relgate_trust.dsse.DsseError" in names
    assert names >= PRIVATE_CONTROL_FLOW  # the exemptions still name real classes


def test_every_agent_exception_is_an_agent_error() -> None:
    outside = sorted(
        name
        for name, cls in _exceptions().items()
        if name not in PRIVATE_CONTROL_FLOW and not issubclass(cls, AgentError)
    )
    assert outside == []
