"""Record schemas of the three corpus kinds the tests build: text, token ids, binary."""

from relgate.records.record_schema import TEXT_SCHEMA, FieldSpec, RecordSchema, TokenRule

TEXT = TEXT_SCHEMA

#: Pre-tokenized records (seed 004's planning case: token ids as uint32).
TOKENS = RecordSchema(
    name="example.tokens.v1",
    fields=(
        FieldSpec(name="sampleId", type="string"),
        FieldSpec(name="ids", type="list<uint32>"),
        FieldSpec(name="domain", type="string"),
    ),
    content=("ids",),
    tokens=TokenRule(kind="token-ids", column="ids"),
    label="domain",
)

#: Binary payloads with metadata (an image corpus): a nullable caption, integer sizes.
BINARY = RecordSchema(
    name="example.images.v1",
    fields=(
        FieldSpec(name="sampleId", type="string"),
        FieldSpec(name="image", type="binary"),
        FieldSpec(name="mime", type="string"),
        FieldSpec(name="width", type="int32"),
        FieldSpec(name="height", type="int32"),
        FieldSpec(name="score", type="float64"),
        FieldSpec(name="caption", type="string", nullable=True),
        FieldSpec(name="label", type="string"),
    ),
    content=("image", "mime"),
    tokens=TokenRule(kind="none"),
    label="label",
)
