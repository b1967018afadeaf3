"""Generated code for the ``turnwire_client.v1`` protobuf package (``make protos``; do not edit)."""
