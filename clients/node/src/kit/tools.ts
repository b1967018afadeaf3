// A ToolExecutorService from tool definitions (tools.proto, docs/tools.md): ListTools from the
// definitions, ExecuteTool runs one: a returned value is the final result, an async generator's
// yields are preliminary results (streamed in order, with back-pressure) and its return value the
// final one; a thrown error is the call's `error` (the model reads it). When the sidecar cancels
// the call (the turn was cancelled, the call's deadline passed) the tool's `signal` aborts and
// nothing more is written.

import { randomUUID } from 'node:crypto';
import { once } from 'node:events';

import type { JsonObject } from '@bufbuild/protobuf';
import { durationFromMs } from '@bufbuild/protobuf/wkt';
import type * as grpc from '@grpc/grpc-js';

import type { ExecuteToolRequest, ExecuteToolResponse, ToolSpec } from '../gen/turnwire/v1/tools_pb.js';
import { callSignal, parentRequestIdOf, TOOL_EXECUTOR_SERVICE } from './grpc.js';
import { type KitJson, type KitJsonObject, parseKitJson, stringifyKitJson } from './json.js';

/** What a tool's `execute` gets besides its input. */
export interface ToolContext {
  /** Aborts when the sidecar cancels the call (the turn was cancelled, its deadline passed). */
  signal: AbortSignal;
  /**
   * The same for this call on every attempt, recovery and replica (`tw-k-` and 32 hex digits):
   * hand it to what the tool changes so that a call made again has its effect once.
   */
  idempotencyKey: string;
  /**
   * True when the call runs again after a crash interrupted it while it ran (the tool is
   * `idempotent`): same `idempotencyKey` as before (docs/semantics.md §8, "Tool effects").
   */
  rerun: boolean;
  toolName: string;
  toolCallId: string;
  conversationId: string;
  /** The turn's request id. */
  requestId: string;
  /** 0-based step number. */
  stepNumber: number;
  /** The turn's request id from the call metadata: send it back on calls into the sidecar. */
  parentRequestId: string;
  metadata: grpc.Metadata;
  /** The input as the sidecar sent it (JSON text), for a reader of your own. */
  inputJson: string;
}

/**
 * A tool: what the model sees (`name`, `description`, `inputSchema`, a JSON Schema of an object)
 * and what runs (`execute`). `I` is the input's type as the schema describes it (TypeScript types
 * do not exist at run time, so the schema is given, not derived); numbers in the input beyond
 * 2^53 arrive as `bigint`. `execute` returns the final result (any JSON value; a `bigint` is
 * written exactly, `undefined` as null), or is an async generator: each `yield` is a preliminary
 * result the client sees (the model does not), the `return` value the final one. A thrown error
 * becomes the call's error text, which the model reads.
 */
export interface ToolDefinition<I = KitJsonObject, O = KitJson, P = KitJson> {
  name: string;
  description: string;
  inputSchema: JsonObject;
  /** The output's JSON Schema (informational). */
  outputSchema?: JsonObject;
  /** Every call waits for the client's approval (docs/semantics.md §6). */
  requiresApproval?: boolean;
  /** How long one call may run; unset: the sidecar's tool timeout. */
  timeoutMs?: number;
  /**
   * Running a call again with the same `idempotencyKey` has its effect once: a call that was
   * running when the sidecar died is then run again on recovery (`rerun` set); otherwise the model
   * gets the interrupted result (docs/semantics.md §8, "Tool effects").
   */
  idempotent?: boolean;
  execute(input: I, context: ToolContext): O | Promise<O> | AsyncGenerator<P, O, undefined>;
}

/** A defined tool of any input and result types (a host's list mixes them). */
export type Tool = ToolDefinition<any, any, any>;

/** What a tool's name must be: 1-64 of `A-Z a-z 0-9 _ -`, what every provider API accepts. */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * Checks and returns `definition` (typed: `execute` gets `I`). Throws `TypeError` when the name is
 * not 1-64 of `A-Z a-z 0-9 _ -` (the sidecar would leave such a tool out), `inputSchema` is not an
 * object schema (`{type: 'object', …}`, what the model needs) or `timeoutMs` is not above 0.
 */
export function defineTool<I = KitJsonObject, O = KitJson, P = KitJson>(
  definition: ToolDefinition<I, O, P>,
): ToolDefinition<I, O, P> {
  if (!definition.name) throw new TypeError('defineTool(): a tool needs a name');
  if (!TOOL_NAME.test(definition.name)) {
    throw new TypeError(
      `defineTool(): tool name ${JSON.stringify(definition.name)}: use 1-64 of A-Z a-z 0-9 _ - (the sidecar leaves out any other)`,
    );
  }
  if (definition.inputSchema?.type !== 'object') {
    throw new TypeError(
      `defineTool(): ${definition.name}'s inputSchema must be an object schema ({type: 'object', …})`,
    );
  }
  const timeout = definition.timeoutMs;
  if (timeout !== undefined && !(Number.isFinite(timeout) && timeout > 0)) {
    // The sidecar ignores a timeout of 0 or less: the call would run under its own default.
    throw new TypeError(
      `defineTool(): ${definition.name}'s timeoutMs must be milliseconds above 0; leave it out for the sidecar's tool timeout`,
    );
  }
  return Object.freeze({ ...definition });
}

/** A ToolExecutorService ready to serve: `serve({tools})`, or `server.addService(definition, implementation)`. */
export interface ToolHost {
  /** New per host: the sidecar lists the tools again when it changes (a restart). */
  readonly instanceId: string;
  readonly definition: grpc.ServiceDefinition;
  readonly implementation: grpc.UntypedServiceImplementation;
}

/** A ToolExecutorService serving `tools`. Throws `TypeError` when two have the same name. */
export function toolHost(tools: readonly Tool[]): ToolHost {
  const byName = new Map<string, Tool>();
  for (const tool of tools) {
    if (byName.has(tool.name)) throw new TypeError(`toolHost(): two tools are named ${tool.name}`);
    byName.set(tool.name, tool);
  }
  const instanceId = randomUUID();
  const specs = tools.map(specOf);
  const implementation: grpc.UntypedServiceImplementation = {
    ListTools(_call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) {
      callback(null, { tools: specs, instanceId });
    },
    ExecuteTool: (call: grpc.ServerWritableStream<ExecuteToolRequest, ExecuteToolResponse>) =>
      execute(byName, call),
  };
  return { instanceId, definition: TOOL_EXECUTOR_SERVICE, implementation };
}

function specOf(tool: Tool): Partial<ToolSpec> {
  return {
    name: tool.name,
    description: tool.description,
    inputSchema: tool.inputSchema,
    ...(tool.outputSchema ? { outputSchema: tool.outputSchema } : {}),
    requiresApproval: tool.requiresApproval ?? false,
    idempotent: tool.idempotent ?? false,
    ...(tool.timeoutMs !== undefined ? { timeout: durationFromMs(tool.timeoutMs) } : {}),
  };
}

type Result = ExecuteToolResponse['result'];

async function execute(
  byName: Map<string, Tool>,
  call: grpc.ServerWritableStream<ExecuteToolRequest, ExecuteToolResponse>,
): Promise<void> {
  const { signal, done } = callSignal(call);
  const request = call.request;
  // Writes one message, waiting while the sidecar reads slower than the tool yields.
  const send = async (result: Result) => {
    if (!call.write({ result } as ExecuteToolResponse)) await once(call, 'drain', { signal });
  };
  try {
    const tool = byName.get(request.toolName);
    if (!tool) throw new Error(`this host has no tool ${JSON.stringify(request.toolName)}`);
    const context: ToolContext = {
      signal,
      idempotencyKey: request.idempotencyKey,
      rerun: request.rerun,
      toolName: request.toolName,
      toolCallId: request.toolCallId,
      conversationId: request.conversationId,
      requestId: request.requestId,
      stepNumber: request.stepNumber,
      parentRequestId: parentRequestIdOf(call.metadata),
      metadata: call.metadata,
      inputJson: request.inputJson,
    };
    const input = parseKitJson(request.inputJson || '{}');
    const missing = missingMember(tool.inputSchema, input, '');
    if (missing) {
      const [path, isNull] = missing;
      const what = isNull ? 'is required, not null' : 'is required';
      throw new Error(`invalid input for tool ${JSON.stringify(tool.name)}: member "${path}" ${what}`);
    }
    const result = tool.execute(input, context);
    let final: unknown;
    if (isAsyncGenerator(result)) {
      for (;;) {
        const step = await result.next();
        if (signal.aborted) return;
        if (step.done) {
          final = step.value;
          break;
        }
        await send({ case: 'preliminaryOutputJson', value: stringifyKitJson(step.value) });
      }
    } else {
      final = await result;
    }
    if (!signal.aborted) await send({ case: 'outputJson', value: stringifyKitJson(final) });
  } catch (error) {
    if (!signal.aborted) await send({ case: 'error', value: errorText(error) }).catch(() => {});
  } finally {
    done();
    if (!call.cancelled) call.end();
  }
}

function isAsyncGenerator(value: unknown): value is AsyncGenerator<unknown, unknown, undefined> {
  return (
    typeof (value as AsyncGenerator | null)?.[Symbol.asyncIterator] === 'function' &&
    typeof (value as AsyncGenerator).next === 'function'
  );
}

function errorText(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/**
 * The dotted path of the first member `schema` requires (its `required`, at any depth through
 * `properties`, `additionalProperties` and `items`) that `value` leaves out or sets to null, and
 * whether it was null; undefined when none is. Only presence is checked, not types: the model
 * was told the member is required, as the Python and Go kits enforce it.
 */
function missingMember(schema: unknown, value: unknown, prefix: string): [string, boolean] | undefined {
  if (typeof schema !== 'object' || schema === null || typeof value !== 'object' || value === null) {
    return undefined;
  }
  const { required, properties, additionalProperties, items } = schema as Record<string, unknown>;
  if (Array.isArray(value)) {
    for (const [index, item] of value.entries()) {
      const missing = missingMember(items, item, `${prefix}${index}.`);
      if (missing) return missing;
    }
    return undefined;
  }
  const members = value as Record<string, unknown>;
  for (const name of Array.isArray(required) ? required : []) {
    if (typeof name !== 'string') continue;
    if (!Object.hasOwn(members, name) || members[name] === null) {
      return [prefix + name, Object.hasOwn(members, name)];
    }
  }
  for (const name of Object.keys(members).sort()) {
    const declared = (properties as Record<string, unknown> | undefined)?.[name];
    const missing = missingMember(declared ?? additionalProperties, members[name], `${prefix}${name}.`);
    if (missing) return missing;
  }
  return undefined;
}
