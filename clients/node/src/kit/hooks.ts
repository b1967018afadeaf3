// A TurnHooksService from typed handlers: write the hooks you want, and the kit derives the
// subscription list (GetHookSubscriptions) from them, serves each as its unary RPC and on the
// HookSession stream the sidecar prefers (middleware/README.md §10, docs/hooks.md), turns a
// returned plain object into the response message and a thrown error into the call's status, so
// the sidecar applies the entry's failure mode to it.

import { create, type DescMessage, type JsonObject, type MessageInitShape } from '@bufbuild/protobuf';
import * as grpc from '@grpc/grpc-js';

import {
  type AfterToolCallRequest,
  type BeforeStepRequest,
  type BeforeStepResponseSchema,
  type BeforeToolCallRequest,
  type BeforeToolCallResponseSchema,
  type BeforeTurnRequest,
  type BeforeTurnResponseSchema,
  type ChatErrorInfo,
  ChatErrorInfoSchema,
  type ClassifyChatErrorRequest,
  type ClassifyChatErrorResponseSchema,
  Hook,
  type HookAnswer,
  type HookCall,
  type HookSessionRequest,
  type HookSessionResponse,
  type OnChatErrorRequest,
  type OnChatErrorResponseSchema,
  type OnChatResponseRequest,
  type OnChunksRequest,
  type OnStepFinishRequest,
  type StepInfo,
  StepInfoSchema,
  type ToolCallInfo,
  ToolCallInfoSchema,
  type TurnInfo,
  TurnInfoSchema,
} from '../gen/turnwire/v1/hooks_pb.js';
import { PARENT_REQUEST_ID } from '../calls.js';
import { callSignal, type FailedStatus, hookFailure, parentRequestIdOf, TURN_HOOKS_SERVICE } from './grpc.js';
import { type KitJson, type KitJsonObject, parseKitJson, stringifyKitJson } from './json.js';

type MaybePromise<T> = T | Promise<T>;
/** What a deciding hook returns: the response as a plain object (only what changes), or nothing. */
type Answer<S extends DescMessage> = MaybePromise<MessageInitShape<S> | undefined | void>;

/** TurnInfo with `body` always an object (`{}` when the client sent none). */
export type Turn = TurnInfo & { body: JsonObject };
/** A failed turn (ChatErrorInfo) with its turn always set. */
export type Failure = ChatErrorInfo & { turn: Turn };

// The requests as handlers get them: the members the sidecar always sends are never undefined
// (the kit fills in an empty message should one be missing), so handlers need no `?.`.
export type BeforeTurnCall = BeforeTurnRequest & { turn: Turn };
export type BeforeStepCall = BeforeStepRequest & { turn: Turn };
export type BeforeToolCallCall = BeforeToolCallRequest & { turn: Turn; call: ToolCallInfo };
export type AfterToolCallCall = AfterToolCallRequest & { turn: Turn; call: ToolCallInfo };
export type OnStepFinishCall = OnStepFinishRequest & { turn: Turn; step: StepInfo };
export type OnChatResponseCall = OnChatResponseRequest & { turn: Turn };
export type ClassifyChatErrorCall = ClassifyChatErrorRequest & { failure: Failure };
export type OnChatErrorCall = OnChatErrorRequest & { failure: Failure };

/** What every hook handler gets besides its request. */
export interface HookContext {
  /** The request id of the turn the call belongs to (metadata `turnwire-parent-request-id`). */
  parentRequestId: string;
  /**
   * The call's metadata (on HookSession: the stream's, with the call's own
   * `turnwire-parent-request-id` when the stream carries a later turn).
   */
  metadata: grpc.Metadata;
  /** Aborts when the sidecar gives the call up: its deadline passed, or it cancelled the call. */
  signal: AbortSignal;
  /** The call's W3C trace context (`traceparent`, `tracestate`) on HookSession; `{}` otherwise. */
  traceContext: Record<string, string>;
}

/** BeforeToolCall's context: the call's input, parsed (integers beyond 2^53 as `bigint`). */
export interface BeforeToolCallContext extends HookContext {
  input: KitJsonObject;
}

/**
 * The hooks a server implements (docs/semantics.md §3): only those present are subscribed to.
 * Deciding hooks return their response as a plain object (`{system: '…'}`, or a decision from
 * allow/allowWithInput/block/substitute), or nothing for "no change"; observing hooks return
 * nothing. A thrown error (or rejected promise) fails the call: the sidecar applies the failure
 * mode. `onChunks` gets the turn's event batches as they come; return once done with them (on
 * HookSession, batches it has not read yet when it returns are dropped, as on its RPC).
 */
export interface HookHandlers {
  beforeTurn?(request: BeforeTurnCall, context: HookContext): Answer<typeof BeforeTurnResponseSchema>;
  beforeStep?(request: BeforeStepCall, context: HookContext): Answer<typeof BeforeStepResponseSchema>;
  beforeToolCall?(
    request: BeforeToolCallCall,
    context: BeforeToolCallContext,
  ): Answer<typeof BeforeToolCallResponseSchema>;
  afterToolCall?(request: AfterToolCallCall, context: HookContext): MaybePromise<void>;
  onStepFinish?(request: OnStepFinishCall, context: HookContext): MaybePromise<void>;
  onChunks?(batches: AsyncIterable<OnChunksRequest>, context: HookContext): MaybePromise<void>;
  onChatResponse?(request: OnChatResponseCall, context: HookContext): MaybePromise<void>;
  classifyChatError?(
    request: ClassifyChatErrorCall,
    context: HookContext,
  ): Answer<typeof ClassifyChatErrorResponseSchema>;
  onChatError?(request: OnChatErrorCall, context: HookContext): Answer<typeof OnChatErrorResponseSchema>;
}

type HookName = keyof HookHandlers;

/** Each handler's Hook value and RPC name; its key is also its HookCall/HookAnswer member. */
const HOOKS: Record<HookName, { hook: Hook; rpc: string }> = {
  beforeTurn: { hook: Hook.BEFORE_TURN, rpc: 'BeforeTurn' },
  beforeStep: { hook: Hook.BEFORE_STEP, rpc: 'BeforeStep' },
  beforeToolCall: { hook: Hook.BEFORE_TOOL_CALL, rpc: 'BeforeToolCall' },
  afterToolCall: { hook: Hook.AFTER_TOOL_CALL, rpc: 'AfterToolCall' },
  onStepFinish: { hook: Hook.ON_STEP_FINISH, rpc: 'OnStepFinish' },
  onChunks: { hook: Hook.ON_CHUNKS, rpc: 'OnChunks' },
  onChatResponse: { hook: Hook.ON_CHAT_RESPONSE, rpc: 'OnChatResponse' },
  classifyChatError: { hook: Hook.CLASSIFY_CHAT_ERROR, rpc: 'ClassifyChatError' },
  onChatError: { hook: Hook.ON_CHAT_ERROR, rpc: 'OnChatError' },
};

/**
 * The hooks a server may only observe (hooks.proto GetHookSubscriptionsResponse.observed_hooks):
 * the deciding hooks and the turn's end hooks.
 */
export type ObservableHook =
  'beforeTurn' | 'beforeStep' | 'beforeToolCall' | 'onChatResponse' | 'onChatError';
const OBSERVABLE: readonly HookName[] = [
  'beforeTurn',
  'beforeStep',
  'beforeToolCall',
  'onChatResponse',
  'onChatError',
] satisfies ObservableHook[];
/** Hooks the sidecar never waits for on a HookSession anyway (posted): observing one declares nothing. */
const NEVER_AWAITED: readonly string[] = ['afterToolCall', 'onStepFinish', 'onChunks'];

/** Options of `hooks()`. */
export interface HookOptions {
  /** Ask for the message history in BeforeTurn and BeforeStep requests (large; default false). */
  includeMessages?: boolean;
  /**
   * Hooks you only observe, each with its handler (hooks.proto observed_hooks). Deciding hooks
   * (beforeTurn, beforeStep, beforeToolCall): on HookSession the sidecar does not wait for them;
   * it ignores their answers (on unary RPCs too) and goes on when they fail. The turn's end hooks
   * (onChatResponse, onChatError): on HookSession the sidecar sends TurnEnd to the client without
   * waiting for the server; the server still gets the call, in order, after the turn's other
   * calls, and onChatError's answer is ignored (the error surfaces as it was). One that returns a
   * change is answered empty all the same, with one warning per hook per process; a thrown error
   * still fails the call.
   */
  observe?: readonly ObservableHook[];
}

/** A TurnHooksService ready to serve: `serve({hooks})`, or `server.addService(definition, implementation)`. */
export interface HookServer {
  /** The hooks subscribed to, derived from the handlers present (in Hook order). */
  readonly subscriptions: Hook[];
  readonly definition: grpc.ServiceDefinition;
  readonly implementation: grpc.UntypedServiceImplementation;
}

/** Run it as it is (BeforeToolCall; the same as returning nothing). */
export function allow(): MessageInitShape<typeof BeforeToolCallResponseSchema> {
  return { decision: { case: 'allow', value: {} } };
}

/** Run it with `input` instead (BeforeToolCall); written as JSON, `bigint`s exact. */
export function allowWithInput(input: KitJsonObject): MessageInitShape<typeof BeforeToolCallResponseSchema> {
  return { decision: { case: 'allowWithInput', value: { inputJson: stringifyKitJson(input) } } };
}

/** Do not run it; the model reads `reason` (BeforeToolCall). */
export function block(reason: string): MessageInitShape<typeof BeforeToolCallResponseSchema> {
  return { decision: { case: 'block', value: { reason } } };
}

/** Do not run it; the model reads `output` as its result (BeforeToolCall). */
export function substitute(output: KitJson): MessageInitShape<typeof BeforeToolCallResponseSchema> {
  return { decision: { case: 'substitute', value: { outputJson: stringifyKitJson(output) } } };
}

/**
 * A TurnHooksService from `handlers` (see HookHandlers). GetHookSubscriptions answers the hooks
 * present, those of `options.observe` as `observed_hooks` (see HookOptions), `hook_session: true`
 * and `hook_session_chunks: true`; every hook is served both as its unary RPC (OnChunks: its
 * client-streaming RPC) and on HookSession, where a stream's calls are handled one at a time, in
 * order, each answered as soon as it is done (OnChunks batches: see `session`). Throws
 * `TypeError` for a key that is no hook (a typo would silently never be called), for no handler at
 * all (the sidecar would call nothing), and for an `observe` entry that is no hook you can observe
 * (a deciding hook, onChatResponse or onChatError) or has no handler, as the Python and Go kits
 * refuse them.
 */
export function hooks(handlers: HookHandlers, options: HookOptions = {}): HookServer {
  const names = Object.keys(handlers).filter(
    (name) => (handlers as Record<string, unknown>)[name] !== undefined,
  );
  for (const name of names) {
    if (!(name in HOOKS))
      throw new TypeError(`hooks(): "${name}" is no hook (one of ${Object.keys(HOOKS).join(', ')})`);
  }
  if (names.length === 0) {
    throw new TypeError(`hooks(): no handler given (one of ${Object.keys(HOOKS).join(', ')})`);
  }
  const present = names as HookName[];
  const observed = new Set<HookName>(options.observe);
  for (const name of observed) {
    if (!OBSERVABLE.includes(name))
      throw new TypeError(
        `hooks(): observe: "${name}" is not a hook you can observe (one of ${OBSERVABLE.join(', ')})` +
          (NEVER_AWAITED.includes(name) ? '; the sidecar never waits for it on a HookSession anyway' : ''),
      );
    if (!present.includes(name)) throw new TypeError(`hooks(): observe: "${name}" has no handler`);
  }
  const subscriptions = present.map((name) => HOOKS[name].hook).sort((a, b) => a - b);
  const observedHooks = [...observed].map((name) => HOOKS[name].hook).sort((a, b) => a - b);
  const implementation: grpc.UntypedServiceImplementation = {
    GetHookSubscriptions(
      _call: grpc.ServerUnaryCall<unknown, unknown>,
      callback: grpc.sendUnaryData<unknown>,
    ) {
      callback(null, {
        hooks: subscriptions,
        includeMessages: options.includeMessages ?? false,
        hookSession: true,
        // A turn's OnChunks batches as HookSession calls too (served by `session`).
        hookSessionChunks: true,
        // Each session call's turn is taken from the call: streams may carry turns one after another.
        reuseHookSession: true,
        observedHooks,
      });
    },
    HookSession: (stream: grpc.ServerDuplexStream<HookSessionRequest, HookSessionResponse>) =>
      session(handlers, observed, stream),
  };
  for (const name of present) {
    if (name === 'onChunks') implementation.OnChunks = chunks(handlers.onChunks!);
    else implementation[HOOKS[name].rpc] = unary(handlers, observed, name);
  }
  return { subscriptions, definition: TURN_HOOKS_SERVICE, implementation };
}

type UnaryName = Exclude<HookName, 'onChunks'>;

/** The members each hook's request always has (see BeforeTurnCall…), with their message types. */
const ALWAYS: Record<UnaryName, [string, DescMessage][]> = {
  beforeTurn: [['turn', TurnInfoSchema]],
  beforeStep: [['turn', TurnInfoSchema]],
  beforeToolCall: [
    ['turn', TurnInfoSchema],
    ['call', ToolCallInfoSchema],
  ],
  afterToolCall: [
    ['turn', TurnInfoSchema],
    ['call', ToolCallInfoSchema],
  ],
  onStepFinish: [
    ['turn', TurnInfoSchema],
    ['step', StepInfoSchema],
  ],
  onChatResponse: [['turn', TurnInfoSchema]],
  classifyChatError: [['failure', ChatErrorInfoSchema]],
  onChatError: [['failure', ChatErrorInfoSchema]],
};

/** `request` with the members its hook always has set, and `turn.body` an object. */
function completed(name: UnaryName, request: Record<string, unknown>): Record<string, unknown> {
  for (const [field, schema] of ALWAYS[name]) request[field] ??= create(schema);
  const turn = ((request.failure as Record<string, unknown> | undefined) ?? request) as { turn?: TurnInfo };
  turn.turn ??= create(TurnInfoSchema);
  turn.turn.body ??= {};
  return request;
}

/** The observed hooks that returned a change, warned about (`run`). */
const warned = new Set<HookName>();

/**
 * Runs handler `name` on one request; resolves with its response (an initializer, `{}` for none).
 * An `observed` hook's is `{}` whatever it returned, as the sidecar ignores it (hooks.proto
 * observed_hooks); a change (a member other than undefined: onChatError's surfaced error too) is
 * warned about once per hook per process.
 */
async function run(
  handlers: HookHandlers,
  observed: ReadonlySet<HookName>,
  name: UnaryName,
  request: unknown,
  context: HookContext,
): Promise<object> {
  const handler = handlers[name] as (request: unknown, context: HookContext) => unknown;
  completed(name, request as Record<string, unknown>);
  const full =
    name === 'beforeToolCall'
      ? withInput(context, (request as BeforeToolCallRequest).call?.inputJson)
      : context;
  const response = ((await handler.call(handlers, request, full)) as object | undefined) ?? {};
  if (!observed.has(name)) return response;
  if (Object.values(response).some((value) => value !== undefined) && !warned.has(name)) {
    warned.add(name);
    console.warn(`turnwire kit: hook ${name} is observed (hooks() option observe): its answer is ignored`);
  }
  return {};
}

function withInput(context: HookContext, inputJson = ''): BeforeToolCallContext {
  let input: KitJsonObject | undefined;
  return Object.defineProperty({ ...context }, 'input', {
    enumerable: true,
    get: () => (input ??= (inputJson ? parseKitJson(inputJson) : {}) as KitJsonObject),
  }) as BeforeToolCallContext;
}

function unary(handlers: HookHandlers, observed: ReadonlySet<HookName>, name: UnaryName) {
  return (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) =>
    answer(name, call, callback, (context) => run(handlers, observed, name, call.request, context));
}

function chunks(handler: NonNullable<HookHandlers['onChunks']>) {
  return (call: grpc.ServerReadableStream<OnChunksRequest, unknown>, callback: grpc.sendUnaryData<unknown>) =>
    answer('onChunks', call, callback, async (context) => (await handler(call, context), {}));
}

/** Answers a call that has one response with what `work` resolves to, or its error's status. */
function answer(
  hook: string,
  call: grpc.ServerUnaryCall<unknown, unknown> | grpc.ServerReadableStream<unknown, unknown>,
  callback: grpc.sendUnaryData<unknown>,
  work: (context: HookContext) => Promise<object>,
): void {
  const { signal, done } = callSignal(call);
  const context = {
    parentRequestId: parentRequestIdOf(call.metadata),
    metadata: call.metadata,
    signal,
    traceContext: {},
  };
  Promise.resolve()
    .then(() => work(context))
    .then(
      (response) => {
        done();
        callback(null, response);
      },
      (error: unknown) => {
        done();
        callback(hookFailure(hook, error));
      },
    );
}

/** At most this many events of a turn wait for its onChunks handler on HookSession; more are dropped. */
const MAX_WAITING_EVENTS = 4096;

/**
 * HookSession: a turn's calls, handled one at a time in order, a request's answers written
 * together once its last call is done. The stream's metadata names its first turn; each call
 * names its own (a stream the sidecar reuses).
 *
 * A turn's OnChunks batches (`HookCall.on_chunks`, hooks.proto HookSessionRequest) feed one
 * onChunks handler per turn (keyed by the call's parent request id), started by the turn's first
 * batch with that call's context. A batch is answered once queued, never after the handler's
 * work; the turn's last one (OnChunksRequest.last) ends the handler's input and is answered once
 * the handler returned (its failure as the answer's error, as the OnChunks RPC fails), so the
 * turn's later calls wait for it. A later batch of the turn starts a new handler. Handlers whose
 * last batch never came are cancelled when the stream ends or is cancelled, as a cancelled OnChunks
 * RPC's handler is: their signal aborts and their input fails.
 */
function session(
  handlers: HookHandlers,
  observed: ReadonlySet<HookName>,
  stream: grpc.ServerDuplexStream<HookSessionRequest, HookSessionResponse>,
) {
  const { signal, done } = callSignal(stream);
  /** The onChunks handlers' signal: aborts with the stream's, or when it ends before their last batch. */
  const chunksAbort = new AbortController();
  const parentRequestId = parentRequestIdOf(stream.metadata);
  /** The running onChunks handlers, by turn: their input, and their failure once they returned. */
  const turns = new Map<string, { batches: Batches; finished: Promise<FailedStatus | undefined> }>();
  let queue = Promise.resolve();
  stream.on('data', (request: HookSessionRequest) => {
    queue = queue.then(async () => {
      // A request's answers go together once its last call is done: the sidecar waits for at
      // most one call of a request, its last (hooks.proto HookSessionRequest).
      const answers: HookAnswer[] = [];
      for (const call of request.calls) {
        if (signal.aborted) return;
        answers.push(await answerOf(call));
      }
      if (!signal.aborted) stream.write({ answers } as HookSessionResponse);
    });
  });
  stream.on('end', () =>
    queue.then(() => {
      endTurns(new DOMException("the HookSession stream ended before the turn's last batch", 'AbortError'));
      done();
      stream.end();
    }),
  );
  stream.on('error', () => {}); // the sidecar gave the stream up (a deadline, a cancel): signal aborts
  signal.addEventListener('abort', () => endTurns(signal.reason), { once: true });

  /** Cancels the onChunks handlers whose last batch did not come. */
  function endTurns(reason: unknown) {
    chunksAbort.abort(reason);
    for (const { batches } of turns.values()) batches.close(reason);
    turns.clear();
  }

  /** The stream's metadata, naming the call's turn when it is another than the stream's first. */
  function metadataOf(call: HookCall): grpc.Metadata {
    if (!call.parentRequestId || call.parentRequestId === parentRequestId) return stream.metadata;
    const metadata = stream.metadata.clone();
    metadata.set(PARENT_REQUEST_ID, call.parentRequestId);
    return metadata;
  }

  async function answerOf(call: HookCall): Promise<HookAnswer> {
    const name = call.hook.case;
    if (name === undefined || !handlers[name]) {
      const message = `${name ? HOOKS[name].rpc : 'this hook call'} is not implemented by this server`;
      return failed(call, { code: grpc.status.UNIMPLEMENTED, details: message });
    }
    const context = {
      parentRequestId: call.parentRequestId || parentRequestId,
      metadata: metadataOf(call),
      signal,
      traceContext: call.traceContext,
    };
    if (call.hook.case === 'onChunks') {
      const failure = await feed(call.hook.value, { ...context, signal: chunksAbort.signal });
      return failure
        ? failed(call, failure)
        : ({ id: call.id, hook: { case: name, value: {} } } as HookAnswer);
    }
    try {
      const value = await run(handlers, observed, name as UnaryName, call.hook.value, context);
      return { id: call.id, hook: { case: name, value } } as HookAnswer;
    } catch (error) {
      return failed(call, hookFailure(name, error));
    }
  }

  /**
   * Queues `batch` for its turn's onChunks handler, starting one for a turn that has none. For the
   * turn's last batch: ends the handler's input and resolves once it returned, with its failure.
   */
  async function feed(batch: OnChunksRequest, context: HookContext): Promise<FailedStatus | undefined> {
    const key = context.parentRequestId;
    let turn = turns.get(key);
    if (!turn) {
      const batches = new Batches(key);
      const finished = Promise.resolve()
        .then(() => handlers.onChunks!(batches, context))
        .then(
          () => undefined,
          (error: unknown) => hookFailure('onChunks', error),
        )
        .finally(() => batches.close()); // what it left unread is dropped
      turns.set(key, (turn = { batches, finished }));
    }
    turn.batches.push(batch);
    if (!batch.last) return undefined;
    turns.delete(key);
    turn.batches.close();
    return turn.finished;
  }
}

/** The answer to `call` that fails it with `status`. */
function failed(call: HookCall, status: FailedStatus): HookAnswer {
  return { id: call.id, error: { code: status.code, message: status.details } } as HookAnswer;
}

/**
 * One turn's OnChunks batches on HookSession, as its onChunks handler reads them. At most
 * MAX_WAITING_EVENTS events wait: the events of a batch beyond that are dropped (logged once per
 * turn), so a slow handler never holds the stream (hooks.proto HookSessionRequest).
 */
class Batches implements AsyncIterable<OnChunksRequest> {
  private readonly waiting: OnChunksRequest[] = [];
  private events = 0;
  private closed = false;
  private failure: unknown;
  private dropping = false;
  private wake = () => {};

  constructor(private readonly turn: string) {}

  /** Queues `batch`, cut to the room left (nothing once closed). */
  push(batch: OnChunksRequest): void {
    if (this.closed) return;
    const room = MAX_WAITING_EVENTS - this.events;
    if (batch.events.length > room) {
      if (!this.dropping)
        console.warn(
          `turnwire kit: onChunks of turn ${this.turn} reads too slowly: ` +
            `events beyond ${MAX_WAITING_EVENTS} waiting dropped`,
        );
      this.dropping = true;
      if (room === 0) return;
      batch.events = batch.events.slice(0, room);
    }
    this.waiting.push(batch);
    this.events += batch.events.length;
    this.wake();
  }

  /** No more batches: the reader gets those waiting, then the end (with `failure`: that, thrown at once). */
  close(failure?: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.failure = failure;
    this.wake();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OnChunksRequest> {
    for (;;) {
      if (this.failure !== undefined) throw this.failure;
      const batch = this.waiting.shift();
      if (batch) {
        this.events -= batch.events.length;
        yield batch;
      } else if (this.closed) return;
      else await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }
}
