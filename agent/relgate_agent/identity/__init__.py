"""Identity: who a process is and what it may do. Certificates checked for their whole life
(``certlife``), the authorization rules of both planes (``authz``) and the manifest-signing
key pair (``keypair``)."""
