// JSON values as plain JS values. The contract carries tool inputs and
// results as JSON text (`input_json`, `output_json`: exactly what the model or
// tool produced) and per-turn data as google.protobuf.Struct, which
// protobuf-es v2 already maps to a plain `JsonObject`.

import type { JsonObject, JsonValue } from '@bufbuild/protobuf';

export type { JsonObject, JsonValue };

/**
 * Parses a `*_json` field. Numbers become JS numbers, so an integer beyond
 * 2^53 loses precision (JSON.parse's rule); read the field's text for those.
 * Throws `SyntaxError` on text that is not JSON (the server never sends such).
 */
export function parseJson(text: string): JsonValue {
  return JSON.parse(text) as JsonValue;
}
