// A turn's event stream (TurnStream) and its outcome folded into plain
// values (TurnResult). Event names and order: docs/semantics.md and
// protos/turnwire/v1/event.proto (a TurnStart, the turn's events, exactly one
// TurnEnd; sequence numbers 1, 2, 3, … without gaps).

import { Code } from '@connectrpc/connect';

import { TurnwireError } from './errors.js';
import { type JsonValue, parseJson } from './json.js';
import type { TurnEnd, TurnEvent } from './gen/turnwire/v1/event_pb.js';
import { FinishReason, TurnStatus } from './gen/turnwire/v1/event_pb.js';
import type { FilePart, Message, SourcePart, Usage as UsageMessage } from './gen/turnwire/v1/message_pb.js';
import { ToolCallDecision, ToolCallState } from './gen/turnwire/v1/message_pb.js';

/** A `TurnStatus` name without its prefix, e.g. `"COMPLETED"` or `"ABORTED"`. */
export type TurnStatusName = keyof typeof TurnStatus;
/** A `ToolCallState` name without its prefix, e.g. `"OUTPUT_AVAILABLE"`. */
export type ToolCallStateName = keyof typeof ToolCallState;
/** A `ToolCallDecision` name without its prefix: `"BLOCKED"` or `"SUBSTITUTED"`, what a `before_tool_call` hook decided. */
export type ToolCallDecisionName = Exclude<keyof typeof ToolCallDecision, 'UNSPECIFIED'>;
/** A `FinishReason` name without its prefix, e.g. `"STOP"` or `"TOOL_CALLS"`. */
export type FinishReasonName = keyof typeof FinishReason;

/** Token usage as plain numbers (the wire's int64 counts fit a double exactly below 2^53). */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
  totalTokens: number;
  reasoningTokens: number;
  cachedInputTokens: number;
  cacheWriteInputTokens: number;
  /** Of cacheWriteInputTokens, those written to a cache kept an hour. */
  cacheWrite1hInputTokens: number;
}

/** One tool call with its input and result as plain JSON values. */
export interface ToolCall {
  toolCallId: string;
  toolName: string;
  /** Where the call is: `"OUTPUT_AVAILABLE"` once it has a result. */
  state: ToolCallStateName;
  /** The parsed input (`input_json`); `undefined` when the input could not be parsed. */
  input: JsonValue | undefined;
  /** The parsed result (`output_json`); `undefined` until the call has one. */
  output: JsonValue | undefined;
  /** Why the call failed or was denied; `""` otherwise. */
  errorText: string;
  /** `"BLOCKED"` or `"SUBSTITUTED"` when a `before_tool_call` hook answered instead of the tool; `undefined` when the tool ran (or has not yet). */
  decision: ToolCallDecisionName | undefined;
  /** True when the client runs the tool itself (`client_tools`): send its result with `submitToolResults`. */
  clientExecuted: boolean;
  /**
   * True when the provider ran the call itself (an Anthropic server tool, a Responses built-in such
   * as web search): nothing to answer; its result, once the provider gave it, is `output` or `errorText`.
   */
  providerExecuted: boolean;
}

/** One model step of a turn, from its StepStart to its StepFinish. */
export interface Step {
  stepNumber: number;
  /** The step's text, its deltas joined. */
  text: string;
  /** The step's reasoning text, when the model sent any. */
  reasoning: string;
  /** Ids of the tool calls the model made in this step (see {@link TurnResult.toolCalls}). */
  toolCallIds: string[];
  /**
   * The sources the step cited, in order: `citedText`, `location`, and `textId`, the id of the
   * text part (`TextPart.id` in the stored message) that cites each (docs/providers.md).
   */
  sources: SourcePart[];
  /** The files the step produced (a generated image …): `data`, `url` or `providerFileId`, and `sizeBytes`. */
  files: FilePart[];
  finishReason: FinishReasonName;
  usage: Usage;
}

/** The outcome of one turn, folded from its events by {@link TurnStream.collect}. */
export interface TurnResult {
  conversationId: string;
  requestId: string;
  status: TurnStatusName;
  /** The steps the turn ran, in order. */
  steps: Step[];
  /** The text of every step with text, separated by a blank line. */
  text: string;
  /** This turn's tool calls in the order the model made them. */
  toolCalls: ToolCall[];
  /** The sources every step cited, in order (see {@link Step.sources}). */
  sources: SourcePart[];
  /** The files every step produced, in order. */
  files: FilePart[];
  /** Usage of the whole turn (`TurnEnd.usage`). */
  usage: Usage;
  /**
   * What the whole turn cost in US dollars (`TurnEnd.cost.usd`); `undefined` when the cost is
   * unknown (a model without a price, a usage the provider did not report: docs/cost.md).
   */
  costUsd: number | undefined;
  /**
   * `TurnEnd.error` as an error (returned, not thrown): why a turn ended `"ERROR"`, and also why
   * one ended `"ABORTED"`, `"INTERRUPTED"` or `"SKIPPED"` when the sidecar said (its `reason`,
   * e.g. `"STREAM_STALLED"`, `"NOTHING_TO_CONTINUE"`); `undefined` when it gave none.
   */
  error: TurnwireError | undefined;
  /** The assistant message as stored (`TurnEnd.message`), when the turn stored one. */
  message: Message | undefined;
  /** `TurnEnd.metadata` (what hooks attached), a plain object. */
  metadata: Record<string, JsonValue>;
  /** Every event, the TurnEnd last. */
  events: TurnEvent[];
}

/**
 * A running turn: an async iterable of its events (each iterable once), or
 * fold it with {@link TurnStream.collect}. Leaving the iteration early
 * (`break`, a throw) cancels the call, and so the turn, as aborting the
 * `signal` passed to the call does: the server stores the partial reply and
 * ends the turn `TURN_STATUS_ABORTED` (DISCONNECT_POLICY_CANCEL, the default).
 * A failed call throws {@link TurnwireError}.
 */
export class TurnStream implements AsyncIterable<TurnEvent> {
  private started = false;

  /**
   * @param open starts the call with the given signal and yields its events.
   * @param signal the caller's signal, which cancels the call.
   * @param requestId the turn's request id (see {@link TurnStream.requestId}).
   * @param explain rewrites the error of a call that failed before any event (a TLS mismatch said plainly).
   */
  constructor(
    private readonly open: (signal: AbortSignal) => AsyncIterable<TurnEvent>,
    private readonly signal?: AbortSignal,
    /** The turn's request id, known before any event: retry a failed turn under it with the same input, cancel it (`cancelChat`) or re-attach (`resumeTurn`). */
    readonly requestId: string = '',
    private readonly explain: (error: TurnwireError) => Promise<TurnwireError> = async (error) => error,
  ) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<TurnEvent, void, undefined> {
    if (this.started) throw new Error('a TurnStream can be iterated once');
    this.started = true;
    const controller = new AbortController();
    const abort = () => controller.abort(this.signal?.reason);
    if (this.signal?.aborted) abort();
    this.signal?.addEventListener('abort', abort, { once: true });
    let received = false;
    try {
      for await (const event of this.open(controller.signal)) {
        received = true;
        yield event;
      }
    } catch (error) {
      throw received ? TurnwireError.from(error) : await this.explain(TurnwireError.from(error));
    } finally {
      this.signal?.removeEventListener('abort', abort);
      // A no-op after the stream's end; cancels the call when the caller left early.
      controller.abort();
    }
  }

  /**
   * Runs the turn to its end and folds its events into a {@link TurnResult}.
   * Throws {@link TurnwireError} when the call fails, and a `TurnwireError`
   * with code `"INTERNAL"` when the stream breaks the contract (a gap in the
   * sequence numbers, an event after TurnEnd, no TurnEnd).
   */
  async collect(): Promise<TurnResult> {
    const folder = new TurnFolder();
    for await (const event of this) folder.add(event);
    return folder.result();
  }
}

function protocolError(message: string): TurnwireError {
  return new TurnwireError({
    grpcCode: Code.Internal,
    message: `turn stream broke the contract: ${message}`,
  });
}

/** Token usage as plain numbers; zeros when the server sent none. */
export function plainUsage(usage: UsageMessage | undefined): Usage {
  return {
    inputTokens: Number(usage?.inputTokens ?? 0n),
    outputTokens: Number(usage?.outputTokens ?? 0n),
    totalTokens: Number(usage?.totalTokens ?? 0n),
    reasoningTokens: Number(usage?.reasoningTokens ?? 0n),
    cachedInputTokens: Number(usage?.cachedInputTokens ?? 0n),
    cacheWriteInputTokens: Number(usage?.cacheWriteInputTokens ?? 0n),
    cacheWrite1hInputTokens: Number(usage?.cacheWrite1hInputTokens ?? 0n),
  };
}

/**
 * A stored message's steps (parts split at each step-start part) as {@link Step} objects, the
 * same view `collect()` gives of a streamed turn: `text`, `reasoning`, `toolCallIds`; what a
 * message does not keep (finish reason, usage) is left empty.
 */
export function messageSteps(message: Message): Step[] {
  const steps: Step[] = [];
  for (const part of message.parts) {
    if (part.kind.case === 'stepStart' || steps.length === 0) steps.push(emptyStep(steps.length));
    const step = steps[steps.length - 1]!;
    if (part.kind.case === 'text') step.text += part.kind.value.text;
    if (part.kind.case === 'reasoning') step.reasoning += part.kind.value.text;
    if (part.kind.case === 'toolCall') step.toolCallIds.push(part.kind.value.toolCallId);
    if (part.kind.case === 'source') step.sources.push(part.kind.value);
    if (part.kind.case === 'file') step.files.push(part.kind.value);
  }
  return steps;
}

function emptyStep(stepNumber: number): Step {
  return {
    stepNumber,
    text: '',
    reasoning: '',
    toolCallIds: [],
    sources: [],
    files: [],
    finishReason: 'UNSPECIFIED',
    usage: plainUsage(undefined),
  };
}

/** The tool-call parts of a stored message, inputs and results as plain JSON values. */
export function messageToolCalls(message: Message): ToolCall[] {
  return message.parts.flatMap((part) => {
    if (part.kind.case !== 'toolCall') return [];
    const call = part.kind.value;
    return [
      {
        toolCallId: call.toolCallId,
        toolName: call.toolName,
        state: ToolCallState[call.state] as ToolCallStateName,
        input: call.inputJson ? parseJson(call.inputJson) : undefined,
        output: call.outputJson ? parseJson(call.outputJson) : undefined,
        errorText: call.errorText,
        decision: decisionName(call.decision),
        clientExecuted: call.clientExecuted,
        providerExecuted: call.providerExecuted,
      },
    ];
  });
}

/** A hook's decision by name; `undefined` for none (`TOOL_CALL_DECISION_UNSPECIFIED`). */
function decisionName(decision: ToolCallDecision): ToolCallDecisionName | undefined {
  return decision === ToolCallDecision.UNSPECIFIED
    ? undefined
    : (ToolCallDecision[decision] as ToolCallDecisionName);
}

/** Checks the events' order one at a time and builds the TurnResult. */
class TurnFolder {
  private readonly events: TurnEvent[] = [];
  private readonly steps: Step[] = [];
  private readonly calls = new Map<string, ToolCall>();
  private end: TurnEnd | undefined;

  add(event: TurnEvent): void {
    if (event.event.case === 'progress') return; // a keepalive, not part of the turn's stream
    if (this.end) throw protocolError(`event ${event.sequenceNumber} after TurnEnd`);
    const previous = this.events.at(-1);
    // A resumed stream starts anywhere; an AttemptStart after a crash recovery
    // jumps past the lost attempt's numbers (docs/semantics.md §8).
    if (previous) {
      const expected = previous.sequenceNumber + 1n;
      const jump = event.event.case === 'attemptStart' && event.sequenceNumber > expected;
      if (event.sequenceNumber !== expected && !jump) {
        throw protocolError(`expected sequence number ${expected}, got ${event.sequenceNumber}`);
      }
    }
    this.events.push(event);
    this.fold(event);
  }

  private fold({ event }: TurnEvent): void {
    const step = this.steps.at(-1);
    switch (event.case) {
      case 'stepStart':
        this.steps.push(emptyStep(event.value.stepNumber));
        break;
      case 'attemptStart':
        // A recovery: its events replace what the previous attempt streamed; one that appends
        // continues the reply as stored (docs/semantics.md §12).
        this.steps.length = 0;
        this.calls.clear();
        if (event.value.appends && event.value.message) {
          this.steps.push(...messageSteps(event.value.message));
          for (const call of messageToolCalls(event.value.message)) this.calls.set(call.toolCallId, call);
        }
        break;
      case 'textDelta':
        if (step) step.text += event.value.delta;
        break;
      case 'reasoningDelta':
        if (step) step.reasoning += event.value.delta;
        break;
      case 'toolInputStart':
        this.call(event.value.toolCallId, event.value.toolName, 'INPUT_STREAMING').providerExecuted ||=
          event.value.providerExecuted;
        break;
      case 'toolInputAvailable': {
        const call = this.call(event.value.toolCallId, event.value.toolName, 'INPUT_AVAILABLE');
        call.providerExecuted ||= event.value.providerExecuted;
        call.input = event.value.inputJson ? parseJson(event.value.inputJson) : undefined;
        break;
      }
      case 'toolInputError': {
        const call = this.call(event.value.toolCallId, event.value.toolName, 'OUTPUT_ERROR');
        call.errorText = event.value.errorText;
        break;
      }
      // The result events name the tool too: a continuation after approvals runs calls whose
      // ToolInputStart was in an earlier turn's stream.
      case 'toolApprovalRequest':
        this.call(event.value.toolCallId, event.value.toolName, 'APPROVAL_REQUESTED');
        break;
      case 'toolOutputAvailable': {
        const call = this.call(event.value.toolCallId, event.value.toolName, 'OUTPUT_AVAILABLE');
        call.output = event.value.outputJson ? parseJson(event.value.outputJson) : null;
        call.decision = decisionName(event.value.decision);
        break;
      }
      case 'toolOutputError':
        this.call(event.value.toolCallId, event.value.toolName, 'OUTPUT_ERROR').errorText =
          event.value.errorText;
        break;
      case 'toolOutputDenied':
        this.call(event.value.toolCallId, event.value.toolName, 'OUTPUT_DENIED').errorText =
          event.value.reason;
        break;
      case 'source':
        step?.sources.push(event.value);
        break;
      case 'file':
        step?.files.push(event.value);
        break;
      case 'stepFinish':
        if (step) {
          step.finishReason = FinishReason[event.value.finishReason] as FinishReasonName;
          step.usage = plainUsage(event.value.usage);
        }
        break;
      case 'turnEnd':
        this.end = event.value;
        break;
    }
  }

  /** The call with this id, created (in the current step) on first sight; moves it to `state`. */
  private call(toolCallId: string, toolName: string, state: ToolCallStateName): ToolCall {
    let call = this.calls.get(toolCallId);
    if (!call) {
      call = {
        toolCallId,
        toolName,
        state,
        input: undefined,
        output: undefined,
        errorText: '',
        decision: undefined,
        clientExecuted: false,
        providerExecuted: false,
      };
      this.calls.set(toolCallId, call);
      this.steps.at(-1)?.toolCallIds.push(toolCallId);
    }
    call.toolName ||= toolName;
    call.state = state;
    return call;
  }

  result(): TurnResult {
    const end = this.end;
    const last = this.events.at(-1);
    if (!end || !last)
      throw protocolError(`the stream ended after ${this.events.length} events without TurnEnd`);
    // The stored message knows which calls the client runs itself.
    if (end.message) {
      for (const stored of messageToolCalls(end.message)) {
        const call = this.calls.get(stored.toolCallId);
        if (call) call.clientExecuted = stored.clientExecuted;
      }
    }
    return {
      conversationId: last.conversationId,
      requestId: last.requestId,
      status: TurnStatus[end.status] as TurnStatusName,
      steps: this.steps,
      text: this.steps
        .map((step) => step.text)
        .filter(Boolean)
        .join('\n\n'),
      toolCalls: [...this.calls.values()],
      sources: this.steps.flatMap((step) => step.sources),
      files: this.steps.flatMap((step) => step.files),
      usage: plainUsage(end.usage),
      costUsd: end.cost?.usd,
      error: end.error ? TurnwireError.fromStatus(end.error) : undefined,
      message: end.message,
      metadata: (end.metadata ?? {}) as Record<string, JsonValue>,
      events: this.events,
    };
  }
}
