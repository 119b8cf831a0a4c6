"""The independent verifier of a shard release: the attempt (:mod:`.verifier`), the
per-shard worker (:mod:`.worker`), the check names (:mod:`.checks`), the report
(:mod:`.report`), the member multiset diff (:mod:`.member_diff`) and the signed
provenance statement of a verified release (:mod:`.attest`)."""
