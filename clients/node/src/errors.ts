// One error class for every failure the client reports: a failed call (its
// gRPC status with the google.rpc details from the `grpc-status-details-bin`
// trailer) and a turn that ended TURN_STATUS_ERROR (its TurnEnd.error, a
// google.rpc.Status). Turnwire sends ErrorInfo with domain `turnwire.dev`
// always, BadRequest for field problems and RetryInfo when a retry may help
// (docs: the "Errors" section of README.md; server side: api/status.py).

import { Code, ConnectError } from '@connectrpc/connect';
import { anyUnpack, durationMs } from '@bufbuild/protobuf/wkt';
import type { Any } from '@bufbuild/protobuf/wkt';

import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from './gen/google/rpc/error_details_pb.js';
import type { BadRequest, ErrorInfo, RetryInfo } from './gen/google/rpc/error_details_pb.js';
import type { Status } from './gen/google/rpc/status_pb.js';

/** The `google.rpc.ErrorInfo.domain` of every error Turnwire sends. */
export const ERROR_DOMAIN = 'turnwire.dev';

/**
 * gRPC status code names (https://grpc.github.io/grpc/core/md_doc_statuscodes.html),
 * indexed by their number; Connect's `Code` enum uses the same numbers.
 */
const CODE_NAMES = [
  'OK',
  'CANCELLED',
  'UNKNOWN',
  'INVALID_ARGUMENT',
  'DEADLINE_EXCEEDED',
  'NOT_FOUND',
  'ALREADY_EXISTS',
  'PERMISSION_DENIED',
  'RESOURCE_EXHAUSTED',
  'FAILED_PRECONDITION',
  'ABORTED',
  'OUT_OF_RANGE',
  'UNIMPLEMENTED',
  'INTERNAL',
  'UNAVAILABLE',
  'DATA_LOSS',
  'UNAUTHENTICATED',
] as const;

/** A gRPC status code name, e.g. `"INVALID_ARGUMENT"`. */
export type GrpcCodeName = (typeof CODE_NAMES)[number];

/** One `google.rpc.BadRequest.FieldViolation`: which request field is wrong, and how. */
export interface FieldViolation {
  /** The field's path in the request, e.g. `"conversation_id"` or `"message.parts[0]"`. */
  field: string;
  /** What is wrong with it and how to fix it. */
  description: string;
}

/** What {@link TurnwireError}'s constructor takes; every field but `grpcCode` is optional. */
export interface TurnwireErrorInit {
  grpcCode: number;
  message?: string;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  fieldViolations?: FieldViolation[];
  retryDelayMs?: number;
  cause?: unknown;
}

/**
 * A failed Turnwire call, or a turn that ended in error.
 *
 * - `code`: the gRPC status code name (`"INVALID_ARGUMENT"`, `"NOT_FOUND"`,
 *   `"UNAVAILABLE"` when the sidecar cannot be reached, `"CANCELLED"` when
 *   the caller aborted); `grpcCode` is its number.
 * - `reason`, `domain`, `metadata`: `google.rpc.ErrorInfo` (`reason` is an
 *   `ErrorReason` name without its prefix, e.g. `"CONVERSATION_NOT_FOUND"`);
 *   `""`/`{}` when the status carried none (transport failures, deadlines).
 * - `fieldViolations`: `google.rpc.BadRequest`'s, in order.
 * - `retryDelayMs`: `google.rpc.RetryInfo.retry_delay` in milliseconds, when sent.
 */
export class TurnwireError extends Error {
  override readonly name = 'TurnwireError';
  readonly code: GrpcCodeName;
  readonly grpcCode: number;
  /** The status message alone (`message` adds the code, reason and violations). */
  readonly rawMessage: string;
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Record<string, string>;
  readonly fieldViolations: FieldViolation[];
  readonly retryDelayMs: number | undefined;

  constructor(init: TurnwireErrorInit) {
    const code = CODE_NAMES[init.grpcCode] ?? 'UNKNOWN';
    const rawMessage = init.message ?? '';
    const fieldViolations = init.fieldViolations ?? [];
    super(describe(code, init.reason ?? '', rawMessage, fieldViolations), { cause: init.cause });
    this.code = code;
    this.grpcCode = CODE_NAMES[init.grpcCode] === undefined ? Code.Unknown : init.grpcCode;
    this.rawMessage = rawMessage;
    this.reason = init.reason ?? '';
    this.domain = init.domain ?? '';
    this.metadata = init.metadata ?? {};
    this.fieldViolations = fieldViolations;
    this.retryDelayMs = init.retryDelayMs;
  }

  /** Builds the error of a `google.rpc.Status`, e.g. `TurnEnd.error`. */
  static fromStatus(status: Status): TurnwireError {
    return new TurnwireError({
      grpcCode: status.code,
      message: status.message,
      ...fromDetails(unpackAll(status.details)),
    });
  }

  /**
   * Builds the error of anything a call threw: a `ConnectError` (its code,
   * message and decoded details), an `AbortError` (`CANCELLED`), or any other
   * value (`UNKNOWN`). A `TurnwireError` is returned as it is.
   */
  static from(error: unknown): TurnwireError {
    if (error instanceof TurnwireError) return error;
    const connectError = ConnectError.from(error);
    return new TurnwireError({
      grpcCode: connectError.code,
      message: connectError.rawMessage,
      cause: error,
      ...fromDetails({
        info: connectError.findDetails(ErrorInfoSchema)[0],
        badRequests: connectError.findDetails(BadRequestSchema),
        retry: connectError.findDetails(RetryInfoSchema)[0],
      }),
    });
  }
}

interface Details {
  info: ErrorInfo | undefined;
  badRequests: BadRequest[];
  retry: RetryInfo | undefined;
}

function unpackAll(details: Any[]): Details {
  const unpacked: Details = { info: undefined, badRequests: [], retry: undefined };
  for (const any of details) {
    unpacked.info ??= anyUnpack(any, ErrorInfoSchema);
    unpacked.retry ??= anyUnpack(any, RetryInfoSchema);
    const badRequest = anyUnpack(any, BadRequestSchema);
    if (badRequest) unpacked.badRequests.push(badRequest);
  }
  return unpacked;
}

function fromDetails({ info, badRequests, retry }: Details): Omit<TurnwireErrorInit, 'grpcCode'> {
  return {
    reason: info?.reason ?? '',
    domain: info?.domain ?? '',
    metadata: { ...info?.metadata },
    fieldViolations: badRequests.flatMap((badRequest) =>
      badRequest.fieldViolations.map(({ field, description }) => ({ field, description })),
    ),
    retryDelayMs: retry?.retryDelay ? durationMs(retry.retryDelay) : undefined,
  };
}

/**
 * `CODE [REASON]: message`, plus `; field: description` for each violation the message does not
 * already state (it states one whose field it names and whose description it holds, in whatever
 * words around them).
 */
function describe(code: string, reason: string, message: string, violations: FieldViolation[]): string {
  let text = reason ? `${code} [${reason}]` : code;
  if (message) text += `: ${message}`;
  for (const { field, description } of violations) {
    if (!(message.includes(description) && message.includes(field))) text += `; ${field}: ${description}`;
  }
  return text;
}
