// @turnwire/client: the TypeScript / Node.js client of the Turnwire sidecar.
// The generated messages and enums are under "@turnwire/client/gen/turnwire/v1/<file>_pb".

export { TurnwireClient } from './client.js';
export type {
  CallOpts,
  ClientToolInit,
  ContinueOptions,
  InputOptions,
  MessageInit,
  Pem,
  TlsOptions,
  ToolApprovalInit,
  ToolResultInit,
  TurnOptions,
  TurnwireClientOptions,
} from './client.js';
export { ERROR_DOMAIN, TurnwireError } from './errors.js';
export type { FieldViolation, GrpcCodeName, TurnwireErrorInit } from './errors.js';
export { parseJson } from './json.js';
export type { JsonObject, JsonValue } from './json.js';
export { TurnStream, messageSteps, messageToolCalls, plainUsage } from './turn.js';
export type {
  FinishReasonName,
  Step,
  ToolCall,
  ToolCallDecisionName,
  ToolCallStateName,
  TurnResult,
  TurnStatusName,
  Usage,
} from './turn.js';
export {
  ConcurrentInputStrategy,
  DisconnectPolicy,
  SubmissionState,
  AddMode,
} from './gen/turnwire/v1/chat_service_pb.js';
export type { Conversation, Submission } from './gen/turnwire/v1/chat_service_pb.js';
export { TurnStatus, FinishReason, ProgressPhase } from './gen/turnwire/v1/event_pb.js';
export type { TurnEvent, TurnEnd, Progress } from './gen/turnwire/v1/event_pb.js';
export {
  Role,
  SourceLocationUnit,
  SourceType,
  ToolCallDecision,
  ToolCallState,
} from './gen/turnwire/v1/message_pb.js';
export type { FilePart, Message, Part, SourcePart } from './gen/turnwire/v1/message_pb.js';
export { ErrorReason } from './gen/turnwire/v1/error_reason_pb.js';
