"""Record schemas of the three corpus kinds the tests build: text, token ids, binary."""

from relgate.demo.image_corpus import IMAGE_RECORDS
from relgate.demo.token_corpus import TOKEN_RECORDS
from relgate.records.record_schema import TEXT_SCHEMA

TEXT = TEXT_SCHEMA
#: Pre-tokenized records (seed 004's planning case: token ids as uint32).
TOKENS = TOKEN_RECORDS
#: Binary payloads with metadata (an image corpus): a nullable caption, integer sizes.
BINARY = IMAGE_RECORDS
