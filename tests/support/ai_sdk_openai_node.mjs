// The Vercel AI SDK's OpenAI provider (@ai-sdk/openai, unmodified) against the OpenAI door:
// generateText and streamText on its default Responses model, a turn where the sidecar runs its
// own tool (calculator) and one where the model calls the application's tool (get_location), whose
// result the SDK sends back itself. Prints what it saw as JSON.
// Usage: node tests/support/ai_sdk_openai_node.mjs BASE_URL TOKEN
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';

const [baseURL, apiKey] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey });
const seen = {};

const ran = await generateText({ model: openai('scripted:calculate'), prompt: '6 * 7?', maxRetries: 0 });
seen.generated = {
  text: ran.text,
  finish: ran.finishReason,
  calls: ran.toolCalls.map((call) => ({ name: call.toolName, providerExecuted: call.providerExecuted ?? false })),
  results: ran.toolResults.map((result) => result.output?.output ?? null),
};

const streamed = streamText({ model: openai('scripted:calculate'), prompt: '6 * 7?', maxRetries: 0 });
const parts = [];
for await (const part of streamed.fullStream) {
  if (part.type === 'error') throw part.error;
  if (part.type.startsWith('tool-')) parts.push([part.type, part.toolName, part.providerExecuted ?? false]);
}
seen.streamed = { parts, text: await streamed.text, finish: await streamed.finishReason };

const getLocation = tool({
  description: "The user's location, from their device",
  inputSchema: jsonSchema({ type: 'object', properties: { precision: { type: 'string' } } }),
  execute: async () => ({ city: 'Paris' }),
});
const asked = await generateText({
  model: openai('scripted:locate'),
  prompt: 'Where am I?',
  tools: { get_location: getLocation },
  maxRetries: 0,
});
seen.client = {
  finish: asked.finishReason,
  calls: asked.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
  results: asked.toolResults.map((result) => result.output),
};
// The SDK's own tool loop: it runs get_location and sends the result back with the history,
// which refers to the door's items by id (item_reference); the next step (another script, as a
// scripted continuation starts its script again) answers.
const looped = await generateText({
  model: openai('scripted:locate'),
  prompt: 'Where am I?',
  tools: { get_location: getLocation },
  stopWhen: stepCountIs(3),
  prepareStep: ({ stepNumber }) => (stepNumber > 0 ? { model: openai('scripted:thanks') } : {}),
  maxRetries: 0,
});
seen.loop = {
  steps: looped.steps.length,
  text: looped.text,
  conversations: looped.steps.map((step) => step.response.body?.conversation?.id ?? null),
};

// A conversation kept as messages: the reply of the first call is in the second's history.
const first = await generateText({ model: openai('scripted:echo'), prompt: 'hi', maxRetries: 0 });
const second = await generateText({
  model: openai('scripted:thanks'),
  messages: [{ role: 'user', content: 'hi' }, ...first.response.messages, { role: 'user', content: 'and now?' }],
  maxRetries: 0,
});
seen.history = {
  text: second.text,
  conversations: [first.response.body?.conversation?.id, second.response.body?.conversation?.id],
};
process.stdout.write(JSON.stringify(seen));
