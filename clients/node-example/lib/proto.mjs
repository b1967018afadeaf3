// Loading Turnwire's .proto files and converting between protobuf and plain JavaScript.
//
// The same files the sidecar is built from (protos/turnwire/v1/) are loaded at run time with
// @grpc/proto-loader, so there is no code generation step. Options used everywhere:
// lowerCamelCase field names (conversationId, inputJson), enums as their names
// ('HOOK_BEFORE_TURN'), 64-bit integers as strings, and `oneofs: true`, which adds a property
// naming the member of a oneof that is set (TurnEvent.event === 'textDelta').

import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** Where the .proto files are: TURNWIRE_PROTOS, else this repository's protos/ folder. */
export const PROTOS_DIR = process.env.TURNWIRE_PROTOS || path.resolve(HERE, '..', '..', '..', 'protos');

const LOADER_OPTIONS = {
  includeDirs: [PROTOS_DIR],
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

const definition = protoLoader.loadSync(
  ['turnwire/v1/chat_service.proto', 'turnwire/v1/hooks.proto', 'turnwire/v1/tools.proto'],
  LOADER_OPTIONS,
);

/** The `turnwire.v1` package: ChatService (client), TurnHooksService and ToolExecutorService (servers). */
export const turnwire = grpc.loadPackageDefinition(definition).turnwire.v1;

/**
 * The metadata key the sidecar puts on every hook and tool call: the running turn's request id.
 * Send it back on calls into the sidecar made from inside a hook or tool (see sidecarClient).
 */
export const PARENT_REQUEST_ID = 'turnwire-parent-request-id';

/** A ChatService client for the sidecar at `target` (HOST:PORT). */
export function sidecarClient(target) {
  return new turnwire.ChatService(target, grpc.credentials.createInsecure());
}

/** Call metadata that marks a call as made from inside the turn `parentRequestId`. */
export function parentMetadata(parentRequestId) {
  const metadata = new grpc.Metadata();
  if (parentRequestId) metadata.set(PARENT_REQUEST_ID, parentRequestId);
  return metadata;
}

/** The request id of the turn a hook or tool call belongs to (from its metadata). */
export function parentRequestIdOf(call) {
  const [value] = call.metadata.get(PARENT_REQUEST_ID);
  return value ? String(value) : '';
}

// google.protobuf.Struct / Value arrive as {fields: {k: {kind, <kind>: …}}}; the request body and
// tool schemas use them. These four functions convert to and from plain JSON-like values.

/** google.protobuf.Value (as decoded) → plain JavaScript. */
export function fromValue(value) {
  if (value == null) return null;
  switch (value.kind) {
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return (value.listValue.values ?? []).map(fromValue);
    case 'nullValue':
    case undefined:
      return null;
    default:
      return value[value.kind];
  }
}

/** google.protobuf.Struct (as decoded) → a plain object ({} when unset). */
export function fromStruct(struct) {
  return Object.fromEntries(Object.entries(struct?.fields ?? {}).map(([k, v]) => [k, fromValue(v)]));
}

/** Plain JavaScript → google.protobuf.Value. */
export function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  switch (typeof value) {
    case 'number':
      return { numberValue: value };
    case 'string':
      return { stringValue: value };
    case 'boolean':
      return { boolValue: value };
    default:
      return { structValue: toStruct(value) };
  }
}

/** A plain object → google.protobuf.Struct. */
export function toStruct(object) {
  return { fields: Object.fromEntries(Object.entries(object).map(([k, v]) => [k, toValue(v)])) };
}

/** A user message with one text part, as ChatRequest.message and SaveMessages want it. */
export function userMessage(text) {
  return { role: 'ROLE_USER', parts: [{ text: { text } }] };
}
