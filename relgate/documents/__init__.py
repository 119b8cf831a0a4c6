"""The signed documents and the typed models around them, below everything that stores,
gates or reads them: the snapshot manifest and its policies, source pins and membership,
the release root with its shard descriptors and shard format, transform specs, declared
readers, and :class:`~relgate.documents.kind.DocumentKind`, the seal / sign / open rule
every signed document kind shares."""
