"""Generated code for the ``turnwire.v1`` protobuf package (``make protos``; do not edit)."""
