// A TypeScript program using @turnwire/client as a project would: type-checked (never run) by
// tests/types.test.mjs against dist/*.d.ts, without Node's type definitions (AbortSignal from the DOM lib).
import {
  DisconnectPolicy,
  TurnwireClient,
  TurnwireError,
  type JsonValue,
  type TurnResult,
} from '@turnwire/client';
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
