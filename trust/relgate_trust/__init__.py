"""relgate-trust: the rules both products share, written once.

Below the core (``relgate``) and the host agent (``relgate_agent``), importing neither:
RFC 8785 canonical JSON (:mod:`.jcs`), DSSE envelopes, keys and the role policy
(:mod:`.dsse`), safe names and paths (:mod:`.names`, :mod:`.fstree`), bounded retries
(:mod:`.retry`), the data-center rule (:mod:`.datacenter`), the signed checkpoint
manifest (:mod:`.manifest`) and the distribution job request the core sends and the agent
receives (:mod:`.job_request`).
"""
