// JSON text ⇄ plain values for the `*_json` fields of hook and tool calls (tool inputs, outputs,
// allow-with-input and substitute decisions), with integers of any size kept exact: the sidecar
// passes the model's JSON through as text (tools.proto, `input_json`), and JSON.parse would round
// an integer beyond 2^53. lossless-json does the parsing and writing.

import { isInteger, isSafeNumber, parse, stringify } from 'lossless-json';

/**
 * A JSON value as the kit hands it over: like `JsonValue`, but an integer beyond
 * Number.MAX_SAFE_INTEGER is a `bigint` (exact), every other number a `number`.
 */
export type KitJson = null | boolean | number | bigint | string | KitJson[] | { [key: string]: KitJson };

/** A JSON object as the kit hands it over (a tool's input). */
export type KitJsonObject = { [key: string]: KitJson };

function parseNumber(text: string): number | bigint {
  return isInteger(text) && !isSafeNumber(text) ? BigInt(text) : Number(text);
}

/**
 * Parses a `*_json` field: integers beyond 2^53 become `bigint`, other numbers `number`.
 * Throws `SyntaxError` on text that is not JSON.
 */
export function parseKitJson(text: string): KitJson {
  return parse(text, null, parseNumber) as KitJson;
}

/**
 * Writes a value as compact JSON text: a `bigint` as its digits, `undefined` (a tool that returns
 * nothing) as `null`. Throws `TypeError` on a value JSON cannot hold (a cycle, a symbol).
 */
export function stringifyKitJson(value: unknown): string {
  return stringify(value === undefined ? null : value) ?? 'null';
}
