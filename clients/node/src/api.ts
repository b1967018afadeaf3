// What both entries of @turnwire/client export (index.ts for Node.js, web.ts for browsers): the
// calls, turn streams, errors, JSON values and the enums and messages callers name. Nothing here
// imports a Node.js module.

export { PARENT_REQUEST_ID, TurnwireCalls } from './calls.js';
export type {
  BudgetOptions,
  CallOpts,
  CallSettings,
  ClientToolInit,
  ContinueOptions,
  InputOptions,
  MessageInit,
  ToolApprovalInit,
  ToolResultInit,
  TurnBudgetInit,
  TurnOptions,
} from './calls.js';
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
export { WebhookDeliveryState } from './gen/turnwire/v1/webhook_pb.js';
export type { WebhookAttempt, WebhookDelivery, WebhookTarget } from './gen/turnwire/v1/webhook_pb.js';
