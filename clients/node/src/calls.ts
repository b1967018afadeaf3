// The calls of a Turnwire client, whatever carries them: every RPC of turnwire.v1.ChatService as
// a method over the generated Connect client, turns as TurnStreams, errors as TurnwireError. The
// Node.js client (client.ts: gRPC over HTTP/2) and the browser client (web.ts: Connect or gRPC-Web
// over fetch) differ only in the transport they give it; nothing here imports a Node.js module.

import type { MessageInitShape } from '@bufbuild/protobuf';
import { type CallOptions, type Client, Code, type Interceptor } from '@connectrpc/connect';

import { TurnwireError } from './errors.js';
import { inputMessageId, newRequestId } from './ids.js';
import type { JsonObject, JsonValue } from './json.js';
import { TurnStream } from './turn.js';
import type { TurnEvent } from './gen/turnwire/v1/event_pb.js';
import {
  type AddMessagesRequestSchema,
  type AddMessagesResponse,
  type ChatService,
  type ClientToolSchema,
  type CreateScheduleRequestSchema,
  type ListSchedulesResponse,
  type Schedule,
  type Conversation,
  type ConcurrentInputStrategy,
  type DisconnectPolicy,
  type ListConversationsResponse,
  type ListSubmissionsRequestSchema,
  type ListSubmissionsResponse,
  type ListTurnsResponse,
  type Submission,
  type SubmitMessagesRequestSchema,
  type SubmitMessagesResponse,
} from './gen/turnwire/v1/chat_service_pb.js';
import { type MessageSchema, Role } from './gen/turnwire/v1/message_pb.js';
import type {
  ListWebhookDeliveriesRequestSchema,
  ListWebhookDeliveriesResponse,
} from './gen/turnwire/v1/webhook_pb.js';

/** The metadata key naming the turn a call is made from inside of (docs/semantics.md §5). */
export const PARENT_REQUEST_ID = 'turnwire-parent-request-id';

/**
 * Sent on every turn stream: this client reads a response's `moreEvents` after its `event`, so the
 * sidecar may send the events that are ready at once in one message (docs/semantics.md §10,
 * "Event batches").
 */
export const EVENT_BATCHES = 'turnwire-event-batches';

/** Options every call takes. */
export interface CallOpts {
  /** Aborting it cancels the call (for a turn: the turn, server-side). */
  signal?: AbortSignal;
  /** The call's deadline in milliseconds. */
  timeoutMs?: number;
  /**
   * For a call made from inside a hook or tool of a running turn: that turn's request id (the
   * `turnwire-parent-request-id` its call carried, `context.parentRequestId` in the kit), sent
   * back so the sidecar applies the nesting rule (docs/semantics.md §5) instead of deadlocking.
   */
  parentRequestId?: string;
}

/** A tool the client runs itself, offered to the model for one turn (ClientTool). */
export type ClientToolInit = MessageInitShape<typeof ClientToolSchema>;
/** A message to store (turnwire.v1.Message), as a plain object. */
export type MessageInit = MessageInitShape<typeof MessageSchema>;

/** Options of every call that runs a turn. */
export interface TurnOptions extends CallOpts {
  /** The turn's model as `provider:model`; the configured default when unset. */
  model?: string;
  /** Free-form per-turn data for lifecycle hooks (Think's `body`). */
  body?: JsonObject;
  /**
   * The turn's request id (1-128 characters of [A-Za-z0-9._:-]); the client chooses one
   * (`r-<uuid>`) when unset, readable as `stream.requestId` before any event. Input messages
   * without an id get `<requestId>.m<index>`, so a failed turn retried under the same request id
   * with the same input stores that input once (docs/semantics.md §11).
   */
  requestId?: string;
  /** What happens to the turn when the caller goes away; CANCEL when unset. */
  disconnectPolicy?: DisconnectPolicy;
  /** Tools the client runs itself, offered to the model for this turn. */
  clientTools?: ClientToolInit[];
}

/** Options of the calls that bring new input to a conversation (all turn calls but ContinueLastTurn). */
export interface InputOptions extends TurnOptions {
  /**
   * What this input does when the conversation has a turn running or queued: ENQUEUE (wait in
   * line), REJECT (FAILED_PRECONDITION, reason TURN_IN_PROGRESS; nothing stored), INTERRUPT (stop
   * the running turn, keep its partial reply, run next) or ROLLBACK (stop it, remove its input
   * and partial reply, run next). The server's default (`limits.concurrent_input`) when unset.
   */
  concurrentInputStrategy?: ConcurrentInputStrategy;
}

/** A turn's own lower budget (`ChatRequest.budget`, docs/cost.md "Budgets"). */
export interface TurnBudgetInit {
  /** Most tokens (input and output of every step, as the provider reports them); at least 1. */
  maxTokens?: number | bigint;
  /** Most US dollars the turn may spend; at least 0. */
  maxUsd?: number;
}

/** The option of the calls that start a turn (Chat, SaveMessages, ContinueLastTurn). */
export interface BudgetOptions {
  /**
   * Lowers this turn's budget below the configured `budgets.turn`, never raises it; with none
   * configured it is the turn's limit (docs/cost.md, "Budgets"). A turn over it ends ERROR,
   * reason BUDGET_EXHAUSTED.
   */
  budget?: TurnBudgetInit;
}

/** The result of one client-side tool call: a JSON `output`, or an `errorText` the model sees. */
export interface ToolResultInit {
  toolCallId: string;
  output?: JsonValue;
  /** Set to report a failure; the model sees this text. */
  errorText?: string;
}

/** One answer to a tool call waiting for approval. */
export interface ToolApprovalInit {
  toolCallId: string;
  approved: boolean;
  /** Why, for a denial; the model is told. */
  reason?: string;
}

/** Options of the calls that may continue a turn after tool results or approvals. */
export interface ContinueOptions extends InputOptions {
  /**
   * Run one continuation turn once every pending call of the message is answered (approved
   * calls run in it); true when unset, as in the Python client. With false the stream ends
   * SKIPPED and the approved calls wait for a later turn (`continueLastTurn`).
   */
  autoContinue?: boolean;
}

/** What every client takes besides where and how to connect. */
export interface CallSettings {
  /** Deadline of each non-streaming call in milliseconds (turns have none unless given per call). */
  timeoutMs?: number;
  /**
   * Let turn streams yield Progress keepalives (events with `event.case ===
   * 'progress'` and sequence number 0, sent while a turn is silent for
   * `limits.progress_interval_seconds`); skipped by default. `collect()` ignores them.
   */
  includeProgress?: boolean;
}

/**
 * The RPCs of one Turnwire sidecar over a Connect client `rpc` of turnwire.v1.ChatService.
 * Calls throw {@link TurnwireError}; calls that run a turn return a {@link TurnStream}.
 */
export abstract class TurnwireCalls {
  private readonly timeoutMs: number | undefined;
  private readonly includeProgress: boolean;

  /** @param rpc the generated Connect client of turnwire.v1.ChatService: every RPC, typed, with its raw messages. */
  protected constructor(
    readonly rpc: Client<typeof ChatService>,
    settings: CallSettings,
  ) {
    this.timeoutMs = settings.timeoutMs;
    this.includeProgress = settings.includeProgress ?? false;
  }

  /** Releases the connection; calls still running fail with `UNAVAILABLE`/`CANCELLED`. */
  abstract close(): void;

  /**
   * Appends a user message with `text` to the conversation (created on first
   * use) and runs a turn: iterate its events, or `await ….collect()`.
   */
  chat(conversationId: string, text: string, options: InputOptions & BudgetOptions = {}): TurnStream {
    const requestId = options.requestId || newRequestId();
    return this.turn(requestId, options, async (call) => {
      const message: MessageInit = {
        id: await inputMessageId(requestId, 0),
        role: Role.USER,
        parts: [{ kind: { case: 'text', value: { text } } }],
      };
      return this.rpc.chat(
        { conversationId, message, ...inputFields(options), ...budgetField(options.budget), requestId },
        call,
      );
    });
  }

  /** Appends zero or more messages and runs a turn on the resulting history (SaveMessages). */
  saveMessages(
    conversationId: string,
    messages: MessageInit[],
    options: InputOptions & BudgetOptions = {},
  ): TurnStream {
    const requestId = options.requestId || newRequestId();
    return this.turn(requestId, options, async (call) => {
      const named = await Promise.all(
        messages.map(async (message, index) =>
          message.id ? message : { ...message, id: await inputMessageId(requestId, index) },
        ),
      );
      return this.rpc.saveMessages(
        {
          conversationId,
          messages: named,
          ...inputFields(options),
          ...budgetField(options.budget),
          requestId,
        },
        call,
      );
    });
  }

  /** Lets the model continue after the last assistant message; SKIPPED when there is none. */
  continueLastTurn(conversationId: string, options: TurnOptions & BudgetOptions = {}): TurnStream {
    const requestId = options.requestId || newRequestId();
    return this.turn(requestId, options, (call) =>
      this.rpc.continueLastTurn(
        { conversationId, ...turnFields(options), ...budgetField(options.budget), requestId },
        call,
      ),
    );
  }

  /** Re-attaches to a turn: its events after `afterSequenceNumber` (0: all), then the live ones. */
  resumeTurn(requestId: string, options: CallOpts & { afterSequenceNumber?: number } = {}): TurnStream {
    const afterSequenceNumber = BigInt(options.afterSequenceNumber ?? 0);
    return this.turn(requestId, options, (call) =>
      this.rpc.resumeTurn({ requestId, afterSequenceNumber }, call),
    );
  }

  /** Streams a submission's turn once it runs (WatchSubmission). */
  watchSubmission(
    submissionId: string,
    options: CallOpts & { afterSequenceNumber?: number } = {},
  ): TurnStream {
    const afterSequenceNumber = BigInt(options.afterSequenceNumber ?? 0);
    // A submission's id is its turn's request id (docs/semantics.md §7).
    return this.turn(submissionId, options, (call) =>
      this.rpc.watchSubmission({ submissionId, afterSequenceNumber }, call),
    );
  }

  /** Stores results of client-side tool calls; with `autoContinue` the continuation turn streams here. */
  submitToolResults(
    conversationId: string,
    results: ToolResultInit[],
    options: ContinueOptions = {},
  ): TurnStream {
    const wire = results.map(({ toolCallId, output, errorText }) =>
      errorText !== undefined
        ? { toolCallId, error: true, errorText }
        : { toolCallId, outputJson: JSON.stringify(output ?? null) },
    );
    const requestId = options.requestId || newRequestId();
    return this.turn(requestId, options, (call) =>
      this.rpc.submitToolResults(
        {
          conversationId,
          results: wire,
          autoContinue: options.autoContinue ?? true,
          ...inputFields(options),
          requestId,
        },
        call,
      ),
    );
  }

  /** Approves or denies tool calls waiting for approval, then continues as {@link submitToolResults}. */
  submitToolApprovals(
    conversationId: string,
    approvals: ToolApprovalInit[],
    options: ContinueOptions = {},
  ): TurnStream {
    const requestId = options.requestId || newRequestId();
    return this.turn(requestId, options, (call) =>
      this.rpc.submitToolApprovals(
        {
          conversationId,
          approvals,
          autoContinue: options.autoContinue ?? true,
          ...inputFields(options),
          requestId,
        },
        call,
      ),
    );
  }

  /** The conversation with all its messages, oldest first, and every page's partialReplies and turnsWithoutReply (follows GetConversation's pages). NOT_FOUND when unknown. */
  async getConversation(conversationId: string, options: CallOpts = {}): Promise<Conversation> {
    let pageToken = '';
    let conversation: Conversation | undefined;
    do {
      const page = await this.unary(options, (call) =>
        this.rpc.getConversation({ conversationId, pageToken }, call),
      );
      if (!page.conversation)
        throw new TurnwireError({
          grpcCode: Code.Internal,
          message: 'GetConversation answered without a conversation',
        });
      if (conversation) {
        // Each page carries the marks of its own messages: keep every page's.
        conversation.messages.push(...page.conversation.messages);
        conversation.partialReplies.push(...page.conversation.partialReplies);
        conversation.turnsWithoutReply.push(...page.conversation.turnsWithoutReply);
      } else conversation = page.conversation;
      pageToken = page.nextPageToken;
    } while (pageToken);
    return conversation;
  }

  /** One page of conversations, most recently updated first (without their messages). */
  listConversations(
    options: CallOpts & { pageSize?: number; pageToken?: string } = {},
  ): Promise<ListConversationsResponse> {
    const { pageSize = 0, pageToken = '' } = options;
    return this.unary(options, (call) => this.rpc.listConversations({ pageSize, pageToken }, call));
  }

  /**
   * One page of a conversation's turns, most recently started first, each with its status, error,
   * cost and stored timeline (docs/inspector.md); `failedOnly`: only the turns that did not complete.
   */
  listTurns(
    conversationId: string,
    options: CallOpts & { pageSize?: number; pageToken?: string; failedOnly?: boolean } = {},
  ): Promise<ListTurnsResponse> {
    const { pageSize = 0, pageToken = '', failedOnly = false } = options;
    return this.unary(options, (call) =>
      this.rpc.listTurns({ conversationId, pageSize, pageToken, failedOnly }, call),
    );
  }

  /** Cancels a running or queued turn by request id; true when one was found. */
  async cancelChat(requestId: string, options: CallOpts = {}): Promise<boolean> {
    return (await this.unary(options, (call) => this.rpc.cancelChat({ requestId }, call))).cancelled;
  }

  /**
   * Deletes a conversation with everything stored about it; false when it did not exist (with
   * `allowMissing`). Its forks stay readable unless `includeForks` deletes them too (docs/forks.md).
   */
  async deleteConversation(
    conversationId: string,
    options: CallOpts & { allowMissing?: boolean; includeForks?: boolean } = {},
  ): Promise<boolean> {
    const { allowMissing = false, includeForks = false } = options;
    return (
      await this.unary(options, (call) =>
        this.rpc.deleteConversation({ conversationId, allowMissing, includeForks }, call),
      )
    ).deleted;
  }

  /**
   * Forks a conversation at one of its messages (ForkConversation, docs/forks.md): a new
   * conversation holding its messages up to and including `atMessageId`, shared without a copy;
   * later changes on either side never show on the other. `newConversationId`: the new id (empty:
   * the server assigns one). Resolves to the new conversation, without messages, `forkedFrom` set.
   */
  async forkConversation(
    conversationId: string,
    atMessageId: string,
    options: CallOpts & { newConversationId?: string } = {},
  ): Promise<Conversation> {
    const newConversationId = options.newConversationId ?? '';
    const response = await this.unary(options, (call) =>
      this.rpc.forkConversation({ conversationId, atMessageId, newConversationId }, call),
    );
    if (!response.conversation)
      throw new TurnwireError({
        grpcCode: Code.Internal,
        message: 'ForkConversation answered without a conversation',
      });
    return response.conversation;
  }

  /** Writes messages to a transcript without running a turn (AddMessages). */
  addMessages(
    request: MessageInitShape<typeof AddMessagesRequestSchema>,
    options: CallOpts = {},
  ): Promise<AddMessagesResponse> {
    return this.unary(options, (call) => this.rpc.addMessages(request, call));
  }

  /** Durably accepts messages for a turn that runs later (SubmitMessages). */
  submitMessages(
    request: MessageInitShape<typeof SubmitMessagesRequestSchema>,
    options: CallOpts = {},
  ): Promise<SubmitMessagesResponse> {
    return this.unary(options, (call) => this.rpc.submitMessages(request, call));
  }

  /** One submission. */
  async getSubmission(submissionId: string, options: CallOpts = {}): Promise<Submission | undefined> {
    return (await this.unary(options, (call) => this.rpc.getSubmission({ submissionId }, call))).submission;
  }

  /** One page of submissions, oldest first. */
  listSubmissions(
    request: MessageInitShape<typeof ListSubmissionsRequestSchema> = {},
    options: CallOpts = {},
  ): Promise<ListSubmissionsResponse> {
    return this.unary(options, (call) => this.rpc.listSubmissions(request, call));
  }

  /**
   * One page of webhook deliveries, oldest first, each with every attempt; filter by
   * `submissionId`, `conversationId` or `state` (docs/webhooks.md). A submission asks for calls
   * with `webhook: { endpoint: 'name' }` (or `{ url }` where the server allows it) in
   * {@link submitMessages}.
   */
  listWebhookDeliveries(
    request: MessageInitShape<typeof ListWebhookDeliveriesRequestSchema> = {},
    options: CallOpts = {},
  ): Promise<ListWebhookDeliveriesResponse> {
    return this.unary(options, (call) => this.rpc.listWebhookDeliveries(request, call));
  }

  /** Cancels a pending or running submission; returns it as stored after the cancel. */
  async cancelSubmission(submissionId: string, options: CallOpts = {}): Promise<Submission | undefined> {
    return (await this.unary(options, (call) => this.rpc.cancelSubmission({ submissionId }, call)))
      .submission;
  }
  /**
   * Creates a schedule (docs/schedules.md): `schedule.input` is submitted on `schedule.cron` (five
   * fields, or six with seconds first) in `schedule.timeZone`, or once at `schedule.fireTime`.
   * INVALID_ARGUMENT names the field for a bad cron expression or time zone. `schedule.input.webhook`
   * (`{ endpoint: 'name' }`) is called when each run ends (docs/schedules.md, "Webhooks"); a target
   * the server refuses is INVALID_ARGUMENT under `schedule.input.webhook`.
   */
  async createSchedule(
    request: MessageInitShape<typeof CreateScheduleRequestSchema>,
    options: CallOpts = {},
  ): Promise<Schedule | undefined> {
    return (await this.unary(options, (call) => this.rpc.createSchedule(request, call))).schedule;
  }

  /** One schedule; NOT_FOUND (SCHEDULE_NOT_FOUND) for an unknown id. */
  async getSchedule(scheduleId: string, options: CallOpts = {}): Promise<Schedule | undefined> {
    return (await this.unary(options, (call) => this.rpc.getSchedule({ scheduleId }, call))).schedule;
  }

  /** One page of the caller's schedules, by id. */
  listSchedules(
    options: CallOpts & { pageSize?: number; pageToken?: string } = {},
  ): Promise<ListSchedulesResponse> {
    const { pageSize = 0, pageToken = '' } = options;
    return this.unary(options, (call) => this.rpc.listSchedules({ pageSize, pageToken }, call));
  }

  /** Pauses a schedule; returns it as stored afterwards. */
  async pauseSchedule(scheduleId: string, options: CallOpts = {}): Promise<Schedule | undefined> {
    return (await this.unary(options, (call) => this.rpc.pauseSchedule({ scheduleId }, call))).schedule;
  }

  /** Resumes a paused schedule from its next time after now; returns it as stored afterwards. */
  async resumeSchedule(scheduleId: string, options: CallOpts = {}): Promise<Schedule | undefined> {
    return (await this.unary(options, (call) => this.rpc.resumeSchedule({ scheduleId }, call))).schedule;
  }

  /** Deletes a schedule (its submissions stay); false when it did not exist (with `allowMissing`). */
  async deleteSchedule(
    scheduleId: string,
    options: CallOpts & { allowMissing?: boolean } = {},
  ): Promise<boolean> {
    const allowMissing = options.allowMissing ?? false;
    return (await this.unary(options, (call) => this.rpc.deleteSchedule({ scheduleId, allowMissing }, call)))
      .deleted;
  }

  private turn(
    requestId: string,
    options: CallOpts,
    open: (call: CallOptions) => AsyncIterable<TurnResponse> | Promise<AsyncIterable<TurnResponse>>,
  ): TurnStream {
    const includeProgress = this.includeProgress;
    return new TurnStream(
      async function* (signal) {
        for await (const { event, moreEvents } of await open({
          signal,
          timeoutMs: options.timeoutMs,
          headers: { ...headersOf(options), [EVENT_BATCHES]: '1' },
        })) {
          for (const one of event ? [event, ...moreEvents] : moreEvents) {
            if (includeProgress || one.event.case !== 'progress') yield one;
          }
        }
      },
      options.signal,
      requestId,
      (error) => this.explain(error, options),
    );
  }

  private async unary<T>(options: CallOpts, call: (call: CallOptions) => Promise<T>): Promise<T> {
    try {
      return await call({
        signal: options.signal,
        timeoutMs: options.timeoutMs ?? this.timeoutMs,
        headers: headersOf(options),
      });
    } catch (error) {
      throw await this.explain(TurnwireError.from(error), options);
    }
  }

  /** `error` of a call that got no answer, said more plainly where the transport can tell why. */
  protected async explain(error: TurnwireError, _options: CallOpts): Promise<TurnwireError> {
    return error;
  }
}

/** A response of a turn stream: an event, and the events batched after it. */
interface TurnResponse {
  event?: TurnEvent;
  moreEvents: TurnEvent[];
}

/** The metadata of a call: the parent turn's request id, when it is made from inside one. */
function headersOf(options: CallOpts): Record<string, string> | undefined {
  return options.parentRequestId ? { [PARENT_REQUEST_ID]: options.parentRequestId } : undefined;
}

function turnFields(options: TurnOptions) {
  return {
    model: options.model ?? '',
    body: options.body,
    requestId: options.requestId ?? '',
    disconnectPolicy: options.disconnectPolicy,
    clientTools: options.clientTools ?? [],
  };
}

function budgetField(budget: TurnBudgetInit | undefined) {
  if (budget === undefined) return {};
  const maxTokens = budget.maxTokens === undefined ? undefined : BigInt(budget.maxTokens);
  return { budget: { maxTokens, maxUsd: budget.maxUsd } };
}

function inputFields(options: InputOptions) {
  return { ...turnFields(options), concurrentInputStrategy: options.concurrentInputStrategy };
}

/** Adds `authorization: Bearer <token>` (RFC 6750 §2.1) to every call. */
export function bearer(token: string): Interceptor {
  return (next) => (request) => {
    request.header.set('authorization', `Bearer ${token}`);
    return next(request);
  };
}
