// TypeScript / Node.js conformance runner: every case of clients/conformance/cases
// against real sidecars, through @turnwire/client (build it first: `make build-node`).
//
// Usage: node clients/conformance/node/run.mjs [CASE_NAME ...]   (default: all cases)
// TURNWIRE_CONFORMANCE_PROTOCOL=connect (or grpc-web) runs the cases over the sidecar's HTTP
// listener (http.listen) instead of gRPC: the browser entry's TurnwireWebClient
// (@turnwire/client/web, @connectrpc/connect-web) on Node.js's fetch, as a browser page would call.
// Starts one `turnwire serve` per distinct config (TURNWIRE_BIN, default the repo's
// .venv/bin/turnwire), runs the cases in file order, prints one line per case and
// `N passed, M failed`; exits 1 when a case failed. The case format and the matching rules:
// clients/conformance/README.md.

import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import {
  createRegistry,
  fromJson,
  toJson as toJsonBare,
} from "@bufbuild/protobuf";
import { TurnwireClient, TurnwireError } from "@turnwire/client";
import { TurnwireWebClient } from "@turnwire/client/web";
import {
  AddMessagesRequestSchema,
  ClientToolSchema,
  ConversationSchema,
  DisconnectPolicy,
  ListConversationsResponseSchema,
  ListTurnsResponseSchema,
  CreateScheduleRequestSchema,
  ListSchedulesResponseSchema,
  ScheduleSchema,
  ListSubmissionsRequestSchema,
  ListSubmissionsResponseSchema,
  AddMessagesResponseSchema,
  SubmissionSchema,
  SubmitMessagesRequestSchema,
  SubmitMessagesResponseSchema,
} from "@turnwire/client/gen/turnwire/v1/chat_service_pb";
import {
  TurnEventSchema,
  TurnEndSchema,
} from "@turnwire/client/gen/turnwire/v1/event_pb";
import { MessageSchema } from "@turnwire/client/gen/turnwire/v1/message_pb";
import {
  ListWebhookDeliveriesRequestSchema,
  ListWebhookDeliveriesResponseSchema,
} from "@turnwire/client/gen/turnwire/v1/webhook_pb";
import { file_google_rpc_error_details } from "@turnwire/client/gen/google/rpc/error_details_pb";

import { freePort, startSidecar } from "../../node/tests/sidecar.mjs";

const PROTOCOL = process.env.TURNWIRE_CONFORMANCE_PROTOCOL || "grpc";
if (!["grpc", "connect", "grpc-web"].includes(PROTOCOL))
  throw new Error(
    `TURNWIRE_CONFORMANCE_PROTOCOL must be grpc, connect or grpc-web, not ${PROTOCOL}`,
  );

// The suite's folder (cases/, configs/); another one for the runners' own tests.
const SUITE =
  process.env.TURNWIRE_CONFORMANCE_DIR ||
  path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const WAIT_TIMEOUT_MS = 20_000; // for `eventually` steps and background waits
const CASE_TIMEOUT_MS = 60_000;
const MISSING = Symbol("missing");

class CaseFailure extends Error {}

// TurnEnd.error and Submission.error carry google.rpc details as Any: JSON needs their types.
const registry = createRegistry(file_google_rpc_error_details);
const toJson = (schema, message) => toJsonBare(schema, message, { registry });

// -- matching (the same rules in every runner: see README.md) -----------------------------------

function isDefault(value) {
  if (value === false || value === 0 || value === "" || value === "0")
    return true;
  if (Array.isArray(value)) return value.length === 0;
  if (value && typeof value === "object")
    return Object.keys(value).length === 0;
  return typeof value === "string" && value.endsWith("_UNSPECIFIED");
}

function number(value) {
  if (typeof value === "number") return value;
  if (typeof value === "string" && /^-?\d+$/.test(value)) return Number(value);
  return undefined;
}

const show = (value) => (value === MISSING ? "absent" : JSON.stringify(value));

/** Mismatches of `actual` (proto JSON; MISSING when absent) against `pattern`. */
export function match(pattern, actual, where = "$") {
  if (pattern === "$nonempty")
    return actual !== MISSING && !isDefault(actual)
      ? []
      : [`${where}: expected a value, got ${show(actual)}`];
  if (pattern === "$absent")
    return actual === MISSING || isDefault(actual)
      ? []
      : [`${where}: expected nothing, got ${show(actual)}`];
  const isObject =
    pattern !== null && typeof pattern === "object" && !Array.isArray(pattern);
  if (actual === MISSING) {
    if (isDefault(pattern)) return [];
    if (isObject && !("$contains" in pattern)) actual = {};
    else if (Array.isArray(pattern)) actual = [];
    else return [`${where}: expected ${JSON.stringify(pattern)}, field absent`];
  }
  if (isObject) {
    if ("$contains" in pattern) {
      if (!Array.isArray(actual))
        return [`${where}: expected a list, got ${show(actual)}`];
      return pattern.$contains
        .filter(
          (wanted) => !actual.some((item) => match(wanted, item).length === 0),
        )
        .map(
          (wanted) => `${where}: no element matches ${JSON.stringify(wanted)}`,
        );
    }
    if (actual === null || typeof actual !== "object" || Array.isArray(actual))
      return [`${where}: expected an object, got ${show(actual)}`];
    return Object.entries(pattern).flatMap(([key, wanted]) =>
      match(wanted, key in actual ? actual[key] : MISSING, `${where}.${key}`),
    );
  }
  if (Array.isArray(pattern)) {
    if (!Array.isArray(actual) || actual.length !== pattern.length)
      return [
        `${where}: expected ${pattern.length} elements, got ${show(actual)}`,
      ];
    return pattern.flatMap((wanted, index) =>
      match(wanted, actual[index], `${where}[${index}]`),
    );
  }
  if (pattern === actual) return [];
  if (number(pattern) !== undefined && number(pattern) === number(actual))
    return [];
  return [`${where}: expected ${JSON.stringify(pattern)}, got ${show(actual)}`];
}

/** Whether the event kinds fit the pattern: each entry a kind, optionally with `+`, `*` or `?`. */
export function kindsMatch(pattern, kinds) {
  const regex = pattern
    .map((entry) => {
      const quantifier = "+*?".includes(entry.at(-1)) ? entry.at(-1) : "";
      return `(?:${entry.replace(/[+*?]$/, "")},)${quantifier}`;
    })
    .join("");
  return new RegExp(`^${regex}$`).test(
    kinds.map((kind) => `${kind},`).join(""),
  );
}

const snake = (name) =>
  name.replace(/[A-Z]/g, (letter) => `_${letter.toLowerCase()}`);
const camel = (name) =>
  name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());

function errorView(error) {
  return {
    code: error.code,
    reason: error.reason,
    metadata: error.metadata,
    fieldViolations: error.fieldViolations,
    retryDelay: (error.retryDelayMs ?? 0) > 0,
  };
}

// -- calls ---------------------------------------------------------------------------------------

function turnOptions(request) {
  return {
    requestId: request.requestId,
    body: request.body,
    model: request.model,
    disconnectPolicy: request.disconnectPolicy
      ? DisconnectPolicy[
          request.disconnectPolicy.replace("DISCONNECT_POLICY_", "")
        ]
      : undefined,
    clientTools: (request.clientTools ?? []).map((tool) =>
      fromJson(ClientToolSchema, tool),
    ),
  };
}

const messages = (request) =>
  (request.messages ?? []).map((message) => fromJson(MessageSchema, message));

/** Starts a turn-running RPC through the client's method for it. */
function openStream(client, rpc, request, signal) {
  const conversation = request.conversationId ?? "";
  const options = { ...turnOptions(request), signal };
  const after = {
    afterSequenceNumber: Number(request.afterSequenceNumber ?? 0),
    signal,
  };
  switch (rpc) {
    case "Chat": {
      const text = (request.message?.parts ?? [])
        .map((part) => part.text?.text ?? "")
        .join("");
      return client.chat(conversation, text, options);
    }
    case "SaveMessages":
      return client.saveMessages(conversation, messages(request), options);
    case "ContinueLastTurn":
      return client.continueLastTurn(conversation, options);
    case "ResumeTurn":
      return client.resumeTurn(request.requestId, after);
    case "WatchSubmission":
      return client.watchSubmission(request.submissionId, after);
    case "SubmitToolResults":
      return client.submitToolResults(
        conversation,
        request.results.map((result) =>
          result.error
            ? {
                toolCallId: result.toolCallId,
                errorText: result.errorText ?? "",
              }
            : {
                toolCallId: result.toolCallId,
                output: JSON.parse(result.outputJson ?? "null"),
              },
        ),
        { ...options, autoContinue: Boolean(request.autoContinue) },
      );
    case "SubmitToolApprovals":
      return client.submitToolApprovals(
        conversation,
        request.approvals.map(({ toolCallId, approved, reason }) => ({
          toolCallId,
          approved: Boolean(approved),
          reason,
        })),
        { ...options, autoContinue: Boolean(request.autoContinue) },
      );
    default:
      throw new CaseFailure(`unknown streaming RPC ${rpc}`);
  }
}

/** Runs a unary RPC through the client's method for it; the result as the RPC's response JSON. */
async function callUnary(client, rpc, request) {
  switch (rpc) {
    case "GetConversation":
      return {
        conversation: toJson(
          ConversationSchema,
          await client.getConversation(request.conversationId ?? ""),
        ),
      };
    case "ListConversations":
      return toJson(
        ListConversationsResponseSchema,
        await client.listConversations({
          pageSize: request.pageSize ?? 0,
          pageToken: request.pageToken ?? "",
        }),
      );
    case "ListTurns":
      return toJson(
        ListTurnsResponseSchema,
        await client.listTurns(request.conversationId ?? "", {
          pageSize: request.pageSize ?? 0,
          pageToken: request.pageToken ?? "",
          failedOnly: request.failedOnly ?? false,
        }),
      );
    case "CancelChat":
      return { cancelled: await client.cancelChat(request.requestId ?? "") };
    case "DeleteConversation":
      return {
        deleted: await client.deleteConversation(request.conversationId ?? "", {
          allowMissing: Boolean(request.allowMissing),
          includeForks: Boolean(request.includeForks),
        }),
      };
    case "ForkConversation":
      return {
        conversation: toJson(
          ConversationSchema,
          await client.forkConversation(
            request.conversationId ?? "",
            request.atMessageId ?? "",
            { newConversationId: request.newConversationId ?? "" },
          ),
        ),
      };
    case "AddMessages":
      return toJson(
        AddMessagesResponseSchema,
        await client.addMessages(fromJson(AddMessagesRequestSchema, request)),
      );
    case "SubmitMessages":
      return toJson(
        SubmitMessagesResponseSchema,
        await client.submitMessages(
          fromJson(SubmitMessagesRequestSchema, request),
        ),
      );
    case "GetSubmission":
      return {
        submission: toJson(
          SubmissionSchema,
          await client.getSubmission(request.submissionId ?? ""),
        ),
      };
    case "ListSubmissions":
      return toJson(
        ListSubmissionsResponseSchema,
        await client.listSubmissions(
          fromJson(ListSubmissionsRequestSchema, request),
        ),
      );
    case "ListWebhookDeliveries":
      return toJson(
        ListWebhookDeliveriesResponseSchema,
        await client.listWebhookDeliveries(
          fromJson(ListWebhookDeliveriesRequestSchema, request),
        ),
      );
    case "CancelSubmission":
      return {
        submission: toJson(
          SubmissionSchema,
          await client.cancelSubmission(request.submissionId ?? ""),
        ),
      };
    case "CreateSchedule":
      return {
        schedule: toJson(
          ScheduleSchema,
          await client.createSchedule(fromJson(CreateScheduleRequestSchema, request)),
        ),
      };
    case "GetSchedule":
      return { schedule: toJson(ScheduleSchema, await client.getSchedule(request.scheduleId ?? "")) };
    case "ListSchedules":
      return toJson(
        ListSchedulesResponseSchema,
        await client.listSchedules({ pageSize: request.pageSize ?? 0, pageToken: request.pageToken ?? "" }),
      );
    case "PauseSchedule":
      return { schedule: toJson(ScheduleSchema, await client.pauseSchedule(request.scheduleId ?? "")) };
    case "ResumeSchedule":
      return { schedule: toJson(ScheduleSchema, await client.resumeSchedule(request.scheduleId ?? "")) };
    case "DeleteSchedule":
      return {
        deleted: await client.deleteSchedule(request.scheduleId ?? "", {
          allowMissing: Boolean(request.allowMissing),
        }),
      };
    default:
      throw new CaseFailure(`unknown unary RPC ${rpc}`);
  }
}

const STREAMING = new Set([
  "Chat",
  "SaveMessages",
  "ContinueLastTurn",
  "ResumeTurn",
  "WatchSubmission",
  "SubmitToolResults",
  "SubmitToolApprovals",
]);

/** Runs a streaming step, filling `outcome.events` as they arrive; leaves after `cancel_after_events`. */
async function readStream(client, step, outcome) {
  const limit = step.cancel_after_events;
  try {
    for await (const event of openStream(
      client,
      step.call,
      step.request ?? {},
    )) {
      outcome.events.push(event);
      if (limit !== undefined && outcome.events.length >= limit) {
        outcome.cancelledByClient = true;
        break; // client-side cancel: leaving the iteration cancels the call
      }
    }
  } catch (error) {
    if (!(error instanceof TurnwireError)) throw error;
    outcome.error = error;
  }
  return outcome;
}

/** The step's expectations and the stream rules every turn stream keeps. */
function checkStream(step, outcome) {
  const expect = step.expect ?? {};
  const problems = [];
  const { events } = outcome;
  const kinds = events.map((event) => snake(event.event.case ?? ""));
  const first = Number(step.request?.afterSequenceNumber ?? 0);
  const requestIds = new Set(events.map((event) => event.requestId));
  if (requestIds.size > 1)
    problems.push(`events carry several request ids: ${[...requestIds]}`);
  const numbers = events.map((event) => Number(event.sequenceNumber));
  if (
    events.length &&
    kinds[0] !== "turn_end" &&
    numbers.some((n, i) => n !== numbers[0] + i)
  )
    problems.push(`sequence numbers not consecutive: ${numbers}`);
  if (
    events.length &&
    first &&
    kinds[0] !== "turn_end" &&
    numbers[0] !== first + 1
  )
    problems.push(`resumed stream starts at ${numbers[0]}, not ${first + 1}`);
  if (!outcome.error && !outcome.cancelledByClient) {
    if (
      kinds.filter((kind) => kind === "turn_end").length !== 1 ||
      kinds.at(-1) !== "turn_end"
    )
      problems.push(
        `a complete stream ends with exactly one turn_end: ${kinds}`,
      );
  }
  if (expect.events && !kindsMatch(expect.events, kinds))
    problems.push(
      `event kinds ${JSON.stringify(kinds)} do not fit ${JSON.stringify(expect.events)}`,
    );
  if (expect.error) {
    if (!outcome.error)
      problems.push(
        `expected the call to fail with ${JSON.stringify(expect.error)}, it ended with ${kinds}`,
      );
    else
      problems.push(...match(expect.error, errorView(outcome.error), "error"));
  } else if (outcome.error) {
    problems.push(`the call failed: ${outcome.error.message}`);
  }
  const end =
    kinds.at(-1) === "turn_end" ? events.at(-1).event.value : undefined;
  if (expect.status) {
    const status = end ? TURN_STATUS_NAMES[end.status] : "(no turn_end)";
    if (status !== expect.status)
      problems.push(`status ${status}, expected ${expect.status}`);
  }
  if (expect.turnError) {
    if (!end?.error) problems.push("expected TurnEnd.error, there is none");
    else
      problems.push(
        ...match(
          expect.turnError,
          errorView(TurnwireError.fromStatus(end.error)),
          "turnError",
        ),
      );
  }
  if (expect.turnEnd)
    problems.push(
      ...match(
        expect.turnEnd,
        end ? toJson(TurnEndSchema, end) : MISSING,
        "turnEnd",
      ),
    );
  for (const [kind, pattern] of Object.entries(expect.firstOf ?? {})) {
    const found = events[kinds.indexOf(kind)];
    const payload = found
      ? toJson(TurnEventSchema, found)[camel(kind)]
      : MISSING;
    problems.push(...match(pattern, payload ?? {}, `firstOf.${kind}`));
  }
  if (expect.text !== undefined) {
    const text = events
      .filter((event) => event.event.case === "textDelta")
      .map((event) => event.event.value.delta)
      .join("");
    if (text !== expect.text)
      problems.push(
        `text deltas join to ${JSON.stringify(text)}, expected ${JSON.stringify(expect.text)}`,
      );
  }
  return problems;
}

const TURN_STATUS_NAMES = [
  "UNSPECIFIED",
  "COMPLETED",
  "ERROR",
  "ABORTED",
  "INTERRUPTED",
  "SKIPPED",
];

/** Calls a unary step (again and again until it matches, for `eventually`). */
async function checkUnary(client, step) {
  const expect = step.expect ?? {};
  const giveUp = Date.now() + (step.eventually ? WAIT_TIMEOUT_MS : 0);
  for (;;) {
    let problems;
    try {
      const response = await callUnary(client, step.call, step.request ?? {});
      problems = expect.error
        ? [
            `expected the call to fail with ${JSON.stringify(expect.error)}, it answered ${JSON.stringify(response)}`,
          ]
        : match(expect.response ?? {}, response, "response");
    } catch (error) {
      if (!(error instanceof TurnwireError)) throw error;
      problems = expect.error
        ? match(expect.error, errorView(error), "error")
        : [`the call failed: ${error.message}`];
    }
    if (problems.length === 0 || Date.now() > giveUp) return problems;
    await new Promise((resolve) => setTimeout(resolve, 50)); // the poll interval of `eventually`
  }
}

async function poll(condition, what) {
  const giveUp = Date.now() + WAIT_TIMEOUT_MS;
  while (!condition()) {
    if (Date.now() > giveUp)
      throw new CaseFailure(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20)); // the poll interval
  }
}

/** Runs a case's steps in order; throws CaseFailure at the first unmet expectation. */
async function runCase(client, testCase) {
  const background = new Map();
  for (const [index, step] of testCase.steps.entries()) {
    const where = `step ${index + 1}`;
    let problems;
    if (step.wait !== undefined) {
      const { outcome } = background.get(step.wait);
      await poll(
        () => outcome.events.length >= step.events,
        `${where}: ${step.events} events`,
      );
      continue;
    }
    if (step.await !== undefined) {
      const { promise, started } = background.get(step.await);
      background.delete(step.await);
      problems = checkStream(
        { ...started, expect: step.expect ?? {} },
        await promise,
      );
    } else if (STREAMING.has(step.call)) {
      if (step.background !== undefined) {
        const outcome = { events: [] };
        background.set(step.background, {
          promise: readStream(client, step, outcome),
          started: step,
          outcome,
        });
        continue;
      }
      problems = checkStream(
        step,
        await readStream(client, step, { events: [] }),
      );
    } else {
      problems = await checkUnary(client, step);
    }
    if (problems.length)
      throw new CaseFailure(
        `${where} (${step.call ?? step.await}): ${problems.join("; ")}`,
      );
  }
  if (background.size)
    throw new CaseFailure(
      `background calls never awaited: ${[...background.keys()]}`,
    );
}

function loadCases(names) {
  const dir = path.join(SUITE, "cases");
  return readdirSync(dir)
    .filter((file) => file.endsWith(".json"))
    .sort()
    .map((file) => JSON.parse(readFileSync(path.join(dir, file), "utf8")))
    .filter((testCase) => names.length === 0 || names.includes(testCase.name));
}

async function main(names) {
  const cases = loadCases(names);
  let passed = 0;
  let failed = 0;
  for (const config of new Set(cases.map((testCase) => testCase.config))) {
    const settings = JSON.parse(
      readFileSync(path.join(SUITE, "configs", `${config}.json`), "utf8"),
    );
    const http =
      PROTOCOL === "grpc" ? undefined : `127.0.0.1:${await freePort()}`;
    if (http) settings.http = { listen: http };
    // A deadline: `make test` starts this runner beside pytest's workers (a ~60 s start seen in CI).
    const sidecar = await startSidecar(settings, { startupTimeoutMs: 120_000 });
    const client = http
      ? new TurnwireWebClient({ baseUrl: `http://${http}`, protocol: PROTOCOL })
      : new TurnwireClient({ address: sidecar.address });
    try {
      for (const testCase of cases.filter((c) => c.config === config)) {
        let timer;
        try {
          await Promise.race([
            runCase(client, testCase),
            new Promise((_, reject) => {
              timer = setTimeout(
                () => reject(new CaseFailure("timed out")),
                CASE_TIMEOUT_MS,
              );
            }),
          ]);
          passed += 1;
          console.log(`ok   ${testCase.name}`);
        } catch (error) {
          if (!(error instanceof CaseFailure || error instanceof TurnwireError))
            throw error;
          failed += 1;
          console.log(`FAIL ${testCase.name}: ${error.message}`);
        } finally {
          clearTimeout(timer);
        }
      }
    } finally {
      client.close();
      await sidecar.stop();
    }
  }
  console.log(
    `${passed} passed, ${failed} failed${PROTOCOL === "grpc" ? "" : ` (over ${PROTOCOL})`}`,
  );
  return failed || cases.length === 0 ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
