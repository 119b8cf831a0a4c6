"""Generated protobuf and gRPC code (regenerate with agent/gen_proto.py)."""
