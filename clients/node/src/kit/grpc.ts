// The two services the sidecar calls, as @grpc/grpc-js service definitions built from the
// protobuf-es descriptors the client package generates (src/gen): grpc-js carries the calls,
// protobuf-es encodes the messages, so there is one generated code for the client and the kit.

import {
  create,
  fromBinary,
  type DescMessage,
  type DescService,
  type MessageShape,
  toBinary,
} from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';

import { PARENT_REQUEST_ID } from '../calls.js';
import { TurnHooksService } from '../gen/turnwire/v1/hooks_pb.js';
import { ToolExecutorService } from '../gen/turnwire/v1/tools_pb.js';

/**
 * The grpc-js definition of a generated service: one entry per RPC under its proto name
 * (`BeforeTurn`), messages (de)serialized with protobuf-es. A response may be given as a plain
 * initializer object; it is completed with `create` before encoding.
 */
export function serviceDefinition(service: DescService): grpc.ServiceDefinition {
  return Object.fromEntries(
    service.methods.map((method) => [
      method.name,
      {
        path: `/${service.typeName}/${method.name}`,
        originalName: method.localName,
        requestStream: method.methodKind === 'client_streaming' || method.methodKind === 'bidi_streaming',
        responseStream: method.methodKind === 'server_streaming' || method.methodKind === 'bidi_streaming',
        requestSerialize: encoder(method.input),
        requestDeserialize: decoder(method.input),
        responseSerialize: encoder(method.output),
        responseDeserialize: decoder(method.output),
      },
    ]),
  );
}

function encoder<D extends DescMessage>(schema: D): (message: MessageShape<D>) => Buffer {
  return (message) => Buffer.from(toBinary(schema, create(schema, message)));
}

function decoder<D extends DescMessage>(schema: D): (bytes: Buffer) => MessageShape<D> {
  return (bytes) => fromBinary(schema, bytes);
}

/** `turnwire.v1.TurnHooksService` for `grpc.Server.addService`. */
export const TURN_HOOKS_SERVICE = serviceDefinition(TurnHooksService);

/** `turnwire.v1.ToolExecutorService` for `grpc.Server.addService`. */
export const TOOL_EXECUTOR_SERVICE = serviceDefinition(ToolExecutorService);

/** The turn's request id a call carries in its metadata (empty when absent). */
export function parentRequestIdOf(metadata: grpc.Metadata): string {
  const [value] = metadata.get(PARENT_REQUEST_ID);
  return value === undefined ? '' : String(value);
}

/** A failed call's status: a thrown error's numeric gRPC `code` when it has one, else UNKNOWN. */
export interface FailedStatus {
  code: grpc.status;
  details: string;
}

/** The status a handler's thrown `error` fails its call with (see FailedStatus). */
export function statusOf(error: unknown): FailedStatus {
  const code = (error as { code?: unknown } | null)?.code;
  const known = typeof code === 'number' && Number.isInteger(code) && code > 0 && code <= 16;
  const details = error instanceof Error ? error.message : String(error);
  return { code: known ? (code as grpc.status) : grpc.status.UNKNOWN, details };
}

/**
 * statusOf for a hook handler's thrown `error`, written to stderr (its stack) unless it carries
 * a gRPC code (a deliberate refusal), as the Python kit logs a failed hook: the sidecar sees only
 * the message, so without this the hook server's operator would see nothing of the failure.
 */
export function hookFailure(hook: string, error: unknown): FailedStatus {
  const status = statusOf(error);
  const code = (error as { code?: unknown } | null)?.code;
  if (status.code === grpc.status.UNKNOWN && code === undefined) {
    console.error(`turnwire kit: hook ${hook} failed:`, error);
  }
  return status;
}

/** What callSignal needs of a grpc-js server call (every kind has it). */
interface CancellableCall {
  on(event: 'cancelled', listener: () => void): unknown;
  removeListener(event: 'cancelled', listener: () => void): unknown;
  getDeadline(): grpc.Deadline;
}

/**
 * An AbortSignal that aborts when `call` is cancelled by the caller (a cancel, a hang-up) or its
 * deadline passes, until `done()` says the handler finished (grpc-js also reports `cancelled` for
 * a call closed after its last message, grpc/grpc-node#2771: that is no cancel).
 */
export function callSignal(call: CancellableCall): { signal: AbortSignal; done: () => void } {
  const controller = new AbortController();
  let finished = false;
  const onCancel = () => {
    if (!finished) controller.abort(new DOMException('the sidecar cancelled the call', 'AbortError'));
  };
  call.on('cancelled', onCancel);
  const deadline = call.getDeadline();
  const ms = deadline instanceof Date ? deadline.getTime() - Date.now() : Number(deadline) - Date.now();
  const timer = Number.isFinite(ms)
    ? setTimeout(
        () => finished || controller.abort(new DOMException('the call passed its deadline', 'TimeoutError')),
        Math.max(0, ms),
      )
    : undefined;
  return {
    signal: controller.signal,
    done: () => {
      finished = true;
      clearTimeout(timer);
      call.removeListener('cancelled', onCancel);
    },
  };
}
