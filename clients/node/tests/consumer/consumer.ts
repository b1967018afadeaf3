// A TypeScript program using @turnwire/client as a project would: type-checked (never run) by
// tests/types.test.mjs against dist/*.d.ts, without Node's type definitions (AbortSignal from the DOM lib).
import {
  DisconnectPolicy,
  TurnwireClient,
  TurnwireError,
  type JsonValue,
  type TurnResult,
} from '@turnwire/client';
import {
  TurnwireError as WebError,
  TurnwireWebClient,
  type TurnwireCalls,
  type TurnwireWebClientOptions,
} from '@turnwire/client/web';
import { ErrorReason } from '@turnwire/client/gen/turnwire/v1/error_reason_pb';

export async function chat(pem: Uint8Array): Promise<JsonValue[]> {
  const client = new TurnwireClient({ address: '127.0.0.1:50051', tls: { ca: pem }, token: 't' });
  const controller = new AbortController();
  for await (const { event } of client.chat('c', 'What is 12 * 7?', {
    signal: controller.signal,
    body: { user: 1 },
  })) {
    if (event.case === 'toolInputAvailable') {
      const name: string = event.value.toolName;
      void name;
    }
  }
  const result: TurnResult = await client
    .continueLastTurn('c', { disconnectPolicy: DisconnectPolicy.CONTINUE })
    .collect();
  try {
    await client.getConversation('missing');
  } catch (error) {
    if (error instanceof TurnwireError && error.reason === ErrorReason[ErrorReason.CONVERSATION_NOT_FOUND]) {
      const retry: number | undefined = error.retryDelayMs;
      void retry;
    }
  }
  client.close();
  return result.toolCalls.flatMap((call) => [call.input ?? null, call.output ?? null]);
}

// The browser entry: the same calls, values and error class over Connect or gRPC-Web.
export async function chatFromAPage(token: string): Promise<number | undefined> {
  const options: TurnwireWebClientOptions = {
    baseUrl: 'https://chat.example.com',
    protocol: 'grpc-web',
    token,
  };
  const client: TurnwireCalls = new TurnwireWebClient(options);
  try {
    const result: TurnResult = await client
      .chat('c', 'Hi', { disconnectPolicy: DisconnectPolicy.CONTINUE })
      .collect();
    return result.toolCalls.length;
  } catch (error) {
    const sameClass: typeof TurnwireError = WebError;
    if (error instanceof sameClass) return error.retryDelayMs;
    throw error;
  }
}
